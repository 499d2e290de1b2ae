"""Canonical forms every pod computes alike: one total order of server and switch ids (IPs as
numbers, other ids naturally), and digests of the bytes that say what an input means, whichever
JSON encoder wrote them."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import example, given, settings
from hypothesis import strategies as st
from npu_job.bootstrap import canonical
from npu_job.bootstrap.base.model import Collective
from npu_job.demo.synthetic import synthetic_cluster

from .engines import ENGINES, json_engine

# --- id order: IPs as numbers, other ids naturally ------------------------------------------------


def test_ids_sort_as_numbers_when_they_are_ips_and_naturally_otherwise():
    ids = [
        "tor-10",
        "10.0.0.10",
        "::1",
        "tor-2",
        "10.0.0.9",
        "010.0.0.1",
        "tor-02",
        "2.0.0.1",
        "1.2.3",
        "0::1",
    ]
    assert sorted(ids, key=canonical.id_sort_key) == [
        "2.0.0.1",
        "10.0.0.9",
        "10.0.0.10",  # IPv4 by value
        "0::1",
        "::1",  # IPv6 by value, equal values by spelling
        "1.2.3",
        "010.0.0.1",  # not canonical addresses: natural order
        "tor-02",
        "tor-2",
        "tor-10",
    ]


@settings(max_examples=80, deadline=None)
@given(
    a=st.tuples(
        st.sampled_from(["tor-", "", "r"]), st.integers(0, 10**30), st.sampled_from(["", "0", "00"])
    ),
    b=st.tuples(
        st.sampled_from(["tor-", "", "r"]), st.integers(0, 10**30), st.sampled_from(["", "0", "00"])
    ),
)
def test_natural_order_compares_digit_runs_as_the_numbers_they_spell(a, b):
    (prefix_a, number_a, zeros_a), (prefix_b, number_b, zeros_b) = a, b
    id_a, id_b = f"{prefix_a}{zeros_a}{number_a}", f"{prefix_b}{zeros_b}{number_b}"
    if prefix_a == prefix_b and number_a != number_b:
        assert (canonical.id_sort_key(id_a) < canonical.id_sort_key(id_b)) == (number_a < number_b)


def test_natural_order_takes_digit_runs_of_any_length():
    """``int()`` reads at most 4300 digits; ids are compared however long their numbers are."""
    long_run = "tor-" + "9" * 5000
    longer_run = "tor-1" + "0" * 5000
    assert sorted(
        [longer_run, long_run, "tor-0" + "9" * 5000, "tor-2"], key=canonical.id_sort_key
    ) == ["tor-2", "tor-0" + "9" * 5000, long_run, longer_run]


_IPV4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda parts: ".".join(map(str, parts)))
_OTHER_IDS = st.sampled_from(
    # what inet_aton reads but is no canonical dotted quad, and ids that are no address at all
    ["010.0.0.1", "1.2.3.04", "1.2.3.00", "0x1.2.3.4", "1.2.3", "1.2.3.4 x", "1.2.3.4\n"]
    + ["\u0661.2.3.4", "1.2.3.4.", " 1.2.3.4", "tor-2", "tor-10", "::1", "0::1", ""]
)


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(_IPV4, max_size=12) | st.lists(_IPV4 | _OTHER_IDS, max_size=12))
# inet_aton reads each of these first ids as an address before the second, which is no order
@example(ids=["1.2.3.00", "1.2.3.1"])  # a number of two zeros (octal to inet_aton)
@example(ids=["1.2.3.04", "1.2.3.5"])  # a leading zero
@example(ids=["1.2.3", "1.2.2.9"])  # three parts: 1.2.0.3
@example(ids=["1.2.3.4 x", "1.2.3.5"])  # what follows a space is ignored
@example(ids=["1.2.3 ", "1.2.2.9"])  # three parts and a space: as many non-digits as a quad
def test_id_order_is_the_order_of_id_sort_key(ids):
    """The C-speed path for all-IPv4 ids must sort exactly as id_sort_key does, duplicates too."""
    expected = sorted(range(len(ids)), key=lambda i: canonical.id_sort_key(ids[i]))
    assert canonical.id_order(ids) == expected


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 24),
    tors=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    missing=st.integers(0, 2),
    super_pods=st.sampled_from(["none", "the rank table's", "one server's own"]),
    keyed_by=st.sampled_from(["server_id", "host_ip", "some by host_ip"]),
)
def test_switch_paths_are_each_servers_switch_path(
    nodes, tors, seed, missing, super_pods, keyed_by
):
    """Every server placed by its id and no super pod is looked up in bulk: the same paths as
    asking server by server, and so are the paths of every other cluster."""
    table, topology = synthetic_cluster(
        nodes,
        min(tors, nodes),
        seed=seed,
        missing_topology=min(missing, nodes - 1),
        super_pods=min(tors, nodes, 2) if super_pods == "the rank table's" else 0,
    )
    servers = table.servers
    if keyed_by != "server_id":  # the topology knows (some) servers by their host IPs
        servers = tuple(
            dataclasses.replace(server, server_id=f"node-{index}", host_ip=server.server_id)
            if keyed_by == "host_ip" or index % 2
            else server
            for index, server in enumerate(servers)
        )
    if super_pods == "one server's own":  # a super pod the topology does not know of
        servers = (dataclasses.replace(servers[0], super_pod_id="sp-x"),) + servers[1:]
    table = dataclasses.replace(table, servers=servers)
    expected = tuple(canonical.switch_path(server, topology) for server in table.servers)
    assert canonical.switch_paths(table, topology) == expected
    assert canonical.switch_paths(table, None) == tuple(
        canonical.switch_path(server, None) for server in table.servers
    )


# --- the canonical bytes and their digests --------------------------------------------------------


def test_digests_are_plain_sha256_of_the_canonical_bytes():
    import hashlib

    table, topology = synthetic_cluster(6, 2, seed=3)
    data = canonical.canonical_input(table, topology, Collective.RING)
    assert (
        canonical.input_digest(table, topology, Collective.RING) == hashlib.sha256(data).hexdigest()
    )
    assert canonical.mapping_digest("0-1,1-0") == hashlib.sha256(b"0-1,1-0").hexdigest()


# What the canonical input holds (ids are any text: quotes, control characters, DEL, non-ASCII).
_CANONICAL_DOCUMENTS = st.recursive(
    st.none() | st.integers() | st.text(alphabet=st.characters(codec="utf-8"), max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(document=_CANONICAL_DOCUMENTS)
@example(["\x7f", "\u00e9", "\x00", '"', "\\"])
def test_canonical_bytes_are_json_dumps_ascii_whichever_encoder_runs(document):
    """The input digest hashes these bytes: msgspec (loaded once an input is big) and the standard
    library must write the same ones, so that the digest means the input, not the encoder."""
    expected = json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    for engine in ENGINES:
        with json_engine(engine):
            assert canonical.ascii_json(document) == expected
