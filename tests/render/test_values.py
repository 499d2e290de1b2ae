"""Helm-style values: YAML files, --set syntax, and right-most-wins merging."""

from __future__ import annotations

import pytest
from npu_job.render.values import (
    SetScalar,
    SetSyntaxError,
    SpecInput,
    format_path,
    load_yaml_values,
    merge_values,
    parse_set,
    typed,
)

from npu_job.errors import SHOWN_LIMIT, InputError


def _tree(*sets: str, base=None):
    inputs = [SpecInput("base.yaml", values=base or {})]
    inputs += [SpecInput("--set", assignments=parse_set(text)) for text in sets]
    return typed(merge_values(inputs).tree)


@pytest.mark.parametrize(
    "expr, expected",
    [
        pytest.param("nodes=6", {"nodes": 6}, id="integer"),
        pytest.param("routing=false", {"routing": False}, id="boolean"),
        pytest.param("image=a:1", {"image": "a:1"}, id="string"),
        pytest.param("hccl.base_port=61000", {"hccl": {"base_port": 61000}}, id="dotted"),
        pytest.param("nodes=2,routing=true", {"nodes": 2, "routing": True}, id="two-assignments"),
        pytest.param("args={--lr,0.1}", {"args": ["--lr", "0.1"]}, id="list-braces"),
        pytest.param("args={}", {"args": []}, id="empty-list"),
        pytest.param("args[1]=x", {"args": [None, "x"]}, id="list-index-pads"),
        pytest.param("volumes[0].name=data", {"volumes": [{"name": "data"}]}, id="index-then-key"),
        pytest.param(
            r"labels.app\.kubernetes\.io/name=x",
            {"labels": {"app.kubernetes.io/name": "x"}},
            id="escaped-dots",
        ),
        pytest.param(r"env.CSV=a\,b", {"env": {"CSV": "a,b"}}, id="escaped-comma"),
        pytest.param("env.EQ=a=b", {"env": {"EQ": "a=b"}}, id="equals-in-value"),
        pytest.param("env.EMPTY=", {"env": {"EMPTY": ""}}, id="empty-value"),
        pytest.param("nodes=007", {"nodes": "007"}, id="leading-zero-is-text"),
    ],
)
def test_set_syntax(expr, expected):
    assert _tree(expr) == expected


def test_set_keeps_the_raw_text_beside_the_typed_value():
    (assignment,) = parse_set("env.DEBUG=true")
    assert assignment.value == SetScalar("true", True)
    (string_assignment,) = parse_set("nodes=6", as_string=True)
    assert string_assignment.value == SetScalar("6", "6")


@pytest.mark.parametrize(
    "expr",
    [
        pytest.param("nodes", id="no-equals"),
        pytest.param("=6", id="no-key"),
        pytest.param("a..b=1", id="empty-key"),
        pytest.param("args[x]=1", id="bad-index"),
        pytest.param("args={a,b", id="unclosed-list"),
    ],
)
def test_bad_set_syntax_says_where(expr):
    with pytest.raises(SetSyntaxError, match="at character"):
        parse_set(expr)


def test_later_layers_win_maps_merge_lists_replace_null_deletes():
    base = {"nodes": 2, "env": {"A": "1", "B": "2"}, "args": ["a", "b"], "queue": "q"}
    inputs = [
        SpecInput("base.yaml", values=base),
        SpecInput("more.yaml", values={"env": {"B": "3"}, "args": ["c"], "queue": None}),
        SpecInput("--set", assignments=parse_set("nodes=4")),
    ]
    merged = merge_values(inputs)
    assert typed(merged.tree) == {"nodes": 4, "env": {"A": "1", "B": "3"}, "args": ["c"]}
    assert merged.origin_of(("nodes",)) == "--set"
    assert merged.origin_of(("env", "A")) == "base.yaml"
    assert merged.origin_of(("env", "B")) == "more.yaml"
    assert merged.origin_of(("args", 0)) == "more.yaml"
    assert base == {"nodes": 2, "env": {"A": "1", "B": "2"}, "args": ["a", "b"], "queue": "q"}, (
        "inputs are not mutated"
    )


def test_set_null_removes_a_key():
    assert _tree("routing=null", base={"routing": True, "nodes": 3}) == {"nodes": 3}


def test_yaml_duplicate_keys_are_rejected_with_both_lines():
    with pytest.raises(
        InputError, match=r"job.yaml: line 3: duplicate key 'nodes' \(first at line 1\)"
    ):
        load_yaml_values("nodes: 2\nname: x\nnodes: 3\n", "job.yaml")


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param(
            "name: [unclosed\n", r"job.yaml: line \d+, column \d+: not valid YAML", id="syntax"
        ),
        pytest.param("- a\n- b\n", "top level: expected a mapping", id="top-level-list"),
        pytest.param("a: 1\n---\nb: 2\n", "not valid YAML", id="two-documents"),
    ],
)
def test_yaml_that_is_not_a_spec_mapping(text, message):
    with pytest.raises(InputError, match=message):
        load_yaml_values(text, "job.yaml")


def test_empty_file_is_an_empty_mapping():
    assert load_yaml_values("# only a comment\n", "job.yaml") == {}


def test_format_path_uses_set_syntax():
    assert format_path(("labels", "app.kubernetes.io/name")) == r"labels.app\.kubernetes\.io/name"
    assert format_path(("volumes", 0, "name")) == "volumes[0].name"


def test_null_in_a_mapping_means_the_same_at_any_depth_and_in_any_layer():
    """``env: {A: null}`` removes A whether or not an earlier layer had an env mapping."""
    first = merge_values([SpecInput("job.yaml", values={"env": {"A": None, "B": "1"}})])
    over = merge_values(
        [
            SpecInput("job.yaml", values={"env": {"A": "0"}}),
            SpecInput("more.yaml", values={"env": {"A": None, "B": "1"}}),
        ]
    )
    assert first.tree == over.tree == {"env": {"B": "1"}}
    assert (first.nulls, over.nulls) == ({("env", "A"): "job.yaml"}, {("env", "A"): "more.yaml"})


def test_merge_records_which_input_set_a_key_to_null_until_a_later_value():
    merged = merge_values(
        [
            SpecInput("job.yaml", values={"shm_size": "1Gi", "env": {"A": "1"}}),
            SpecInput("more.yaml", values={"shm_size": None}),
            SpecInput("--set", assignments=parse_set("env.A=null")),
        ]
    )
    assert merged.tree == {"env": {}}
    assert merged.nulls == {("shm_size",): "more.yaml", ("env", "A"): "--set"}
    again = merge_values(
        [
            SpecInput("job.yaml", values={"shm_size": None, "env": None}),
            SpecInput("--set", assignments=parse_set("shm_size=2Gi,env.A=x")),
        ]
    )
    assert again.nulls == {}


# --- inputs that would build huge structures or floods of problems -------------------------------


def test_a_list_index_is_capped_as_in_helm():
    assert _tree("args[65536]=x")["args"][65536] == "x"
    for index in ("65537", "30000000", "9" * 5000):
        with pytest.raises(
            SetSyntaxError, match=r"at character 6: expected a list index from 0 to 65536$"
        ):
            parse_set(f"args[{index}]=x")


@pytest.mark.parametrize(
    "index",
    ["\u0663", "\u00b2", "+1", "-1", " 1"],
    ids=["arabic-digit", "superscript", "plus", "minus", "space"],
)
def test_a_list_index_is_ascii_digits(index):
    with pytest.raises(SetSyntaxError, match="expected a list index"):
        parse_set(f"args[{index}]=x")


def test_a_set_path_nests_at_most_64_keys():
    assert parse_set(".".join(["a"] * 64) + "=x")[0].path == ("a",) * 64
    with pytest.raises(SetSyntaxError, match="expected at most 64 nested keys"):
        parse_set(".".join(["a"] * 65) + "=x")
    with pytest.raises(SetSyntaxError, match="expected at most 64 nested keys"):
        parse_set("a" + "[0]" * 64 + "=x")


def test_a_set_syntax_error_echoes_the_argument_bounded_on_one_line():
    with pytest.raises(SetSyntaxError) as error:
        parse_set("env.A\n=" + "x" * 100_000 + ",[")
    message = str(error.value)
    assert "\n" not in message and len(message) < 200 and "(100009 characters)" in message


def test_padding_lists_with_nulls_has_one_budget_for_all_set_values_and_names_the_argument():
    """Each index is within the cap, but together they would pad lists with millions of nulls."""
    inputs = [SpecInput("job.yaml", values={})]
    inputs += [SpecInput("--set", assignments=parse_set(f"a{n}[40000]=x")) for n in range(3)]
    with pytest.raises(InputError) as error:
        merge_values(inputs)
    assert error.value.exit_code == 3
    assert error.value.message == (
        "--set 'a1[40000]=x': a1[40000]: expected at most 65536 list items left empty (null) in all by "
        "--set list indices; give the list whole instead (a1={x,y})"
    )


def test_items_a_set_index_leaves_empty_are_blamed_on_that_set():
    merged = merge_values(
        [
            SpecInput("job.yaml", values={"args": ["a"]}),
            SpecInput("--set", assignments=parse_set("args[3]=x")),
        ]
    )
    assert typed(merged.tree) == {"args": ["a", None, None, "x"]}
    assert [merged.origin_of(("args", i)) for i in range(4)] == [
        "job.yaml",
        "--set",
        "--set",
        "--set",
    ]


def test_yaml_aliases_cannot_expand_a_spec_beyond_a_million_values():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i + 1}: &a{i + 1} [{', '.join([f'*a{i}'] * 10)}]" for i in range(6)]
    assert load_yaml_values("\n".join(lines[:5]) + "\n", "job.yaml")  # about 10^5 values: fine
    with pytest.raises(
        InputError, match=r"^job.yaml: expands to more than 1000000 values \(YAML aliases repeating"
    ):
        load_yaml_values("\n".join(lines) + "\n", "job.yaml")


@pytest.mark.parametrize("depth", [65, 100, 5000])
def test_yaml_nests_at_most_64_levels(depth):
    assert load_yaml_values("a: " + "[" * 63 + "]" * 63 + "\n", "job.yaml")
    with pytest.raises(InputError, match=r"^job.yaml: (a(\[0\])+: )?nested deeper than 64 levels$"):
        load_yaml_values("a: " + "[" * depth + "]" * depth + "\n", "job.yaml")


@pytest.mark.parametrize(
    "text, line, shown_key",
    [
        pytest.param("1: x\n", 1, "1", id="top-level-integer"),
        pytest.param("env:\n  ~: 1.5\n", 2, "None", id="nested-null"),
        pytest.param("labels:\n  true: x\n", 2, "True", id="nested-boolean"),
        pytest.param("labels: {[a]: b}\n", 1, "['a']", id="unhashable-list"),
        pytest.param(
            "volumes:\n- name: v\n  hostPath: {? {a: 1} : x}\n",
            3,
            "{'a': 1}",
            id="unhashable-mapping",
        ),
    ],
)
def test_every_key_at_every_depth_is_a_string(text, line, shown_key):
    """A non-string key used to crash the error formatting (None) or PyYAML's constructor (a list)."""
    with pytest.raises(InputError) as error:
        load_yaml_values(text, "job.yaml")
    assert (
        error.value.message
        == f"job.yaml: line {line}: expected a string key, got {shown_key} (quote it)"
    )


def test_an_alias_counts_at_the_depth_it_is_used_and_cannot_contain_itself():
    deep = "[" * 60 + "]" * 60
    assert load_yaml_values(f"x: &a {deep}\ny: [[[*a]]]\n", "job.yaml")  # 64 levels under y
    with pytest.raises(
        InputError, match=r"^job.yaml: y\[0\]\[0\]\[0\]\[0\]: nested deeper than 64 levels$"
    ):
        load_yaml_values(f"x: &a {deep}\ny: [[[[*a]]]]\n", "job.yaml")
    with pytest.raises(InputError, match="nested deeper than 64 levels$"):
        load_yaml_values("x: &a [1, *a]\n", "job.yaml")


@pytest.mark.parametrize(
    "key", ["a\nb", "x" * 1_000_000, "tab\there", "nul\x00"], ids=["newline", "1MB", "tab", "nul"]
)
def test_a_hostile_key_is_named_on_one_short_line(key):
    named = format_path(("labels", key))
    assert "\n" not in named and "\t" not in named and "\x00" not in named
    assert len(named) <= 2 * SHOWN_LIMIT
    assert named.startswith("labels.'")


def test_an_ordinary_key_keeps_the_set_syntax():
    assert format_path(("labels", "app.kubernetes.io/name")) == "labels.app\\.kubernetes\\.io/name"
