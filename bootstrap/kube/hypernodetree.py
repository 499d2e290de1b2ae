"""A node's switch path from Volcano HyperNodes (pure): the tree their members make, resolved.

A node's **path** is its chain of HyperNodes from the root down to the HyperNode that holds it,
outermost first, which is the planner's switch path: the tiers above, then that innermost
HyperNode as the node's ToR. Where the tree is not a tree, the choice is deterministic and said:

* a HyperNode listed as a member of several HyperNodes hangs under the one of the lowest tier,
  then the first by name (Volcano refuses a second parent; which one it keeps depends on the order
  it sees them);
* a node held by several HyperNodes is placed under the one of the lowest tier, then by its path
  (names compared as :func:`~npu_job.bootstrap.canonical.id_sort_key` does, outermost first).

A cycle of HyperNodes is an error, as it is for Volcano. Everything here is a function of what
the objects say, never of the order they are listed in.

A tree as Volcano's network discovery writes it (exact members only, nothing held twice) leaves
nothing to choose: :func:`exact_tree_placements` places its nodes in one pass over the decoded
objects, and leaves any other tree to :func:`~.hypernode.read_hypernodes` and :func:`resolve`.
"""

from __future__ import annotations

from typing import (
    AbstractSet,
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from npu_job.errors import shown

from .. import goregexp
from ..base.fields import fail
from ..base.model import Placement
from ..canonical import id_sort_key
from .facts import NodeFacts
from .hypernode import HyperNode, Requirement
from .objects import KubeObject

NOTES_LISTED = 3  # examples a note lists before counting the rest
# HyperNodes from a root down to a node's: a fabric has a handful of tiers (Volcano sets no limit:
# the CRD's spec.tier has only a minimum). The cap keeps the paths, one per HyperNode, from
# growing with the square of a hostile chain's length (30000 deep took over 2 GiB)
MAX_DEPTH = 32
CYCLE_NAMED = 4  # HyperNodes a cycle's error names before counting the rest

# the matching work one resolve may do over all regexMatch members and candidate nodes: a
# character read costs a step; at ~0.4 us a step, about 2 s of Python. A job's 4096 nodes against
# a hundred patterns take about 100 x 4096 x 10 steps at most (a match or a dead anchored start
# ends a search early)
MAX_MATCH_STEPS = 5_000_000


class Resolved(NamedTuple):
    """Where each node sits in the HyperNode tree."""

    placements: Mapping[str, Placement]  # node name -> placement
    paths: Mapping[str, Tuple[Tuple[str, ...], ...]]  # node name -> every path, the chosen first
    notes: Tuple[str, ...]


def exact_tree_placements(
    objects: Sequence[KubeObject], names: Optional[AbstractSet[str]] = None
) -> Optional[Dict[str, Placement]]:
    """``resolve(read_hypernodes(objects), (), source, names=names).placements`` in one pass over
    the decoded objects, for the tree Volcano's discovery writes: every member chosen by
    ``exactMatch``, each HyperNode a member of at most one other, each node (of ``names``, when
    given) a member of one HyperNode, no cycle and every field well-formed. Then resolving has
    nothing to choose, nothing to note and nothing to refuse.

    Anything else returns None, having decided nothing: the caller reads and resolves the tree the
    general way, which makes the choices, writes the notes or names the field that is wrong. (At
    4096 nodes the general way builds a :class:`~.hypernode.Member` per member and walks them
    three times.)
    """
    tiers: Dict[str, int] = {}
    parent: Dict[str, str] = {}  # a HyperNode member -> the HyperNode listing it
    holder: Dict[str, str] = {}  # a node -> the HyperNode listing it
    for obj in objects:
        item = obj.item
        metadata, spec = item.get("metadata"), item.get("spec")
        if type(metadata) is not dict or type(spec) is not dict:
            return None
        name, tier = metadata.get("name"), spec.get("tier")
        members, tier_name = spec.get("members"), spec.get("tierName")
        if (
            type(name) is not str
            or not name
            or name in tiers
            or type(tier) is not int
            or tier < 0
            or (tier_name is not None and type(tier_name) is not str)
            or (members is not None and type(members) is not list)
        ):
            return None
        tiers[name] = tier
        for member in members or ():
            try:  # only JSON objects take these keys: anything else raises (no type test each)
                selector = member["selector"]
                target = selector["exactMatch"]["name"]
                kind = member["type"]
            except (KeyError, TypeError):
                return None
            if len(selector) != 1 or type(target) is not str or not target:
                return None
            if kind == "Node":
                if names is not None and target not in names:
                    continue
                claims = holder
            elif kind == "HyperNode":
                claims = parent
            else:
                return None
            if claims.setdefault(target, name) != name:
                return None
    chains: Dict[str, Optional[Tuple[str, ...]]] = {}
    for hypernode in tiers:  # every chain, so that a cycle anywhere declines as resolve refuses it
        if _chain(hypernode, parent, chains) is None:
            return None
    placed: Dict[str, Placement] = {}  # one Placement per holding HyperNode, shared by its nodes
    placements: Dict[str, Placement] = {}
    for node in sorted(holder):  # resolve's order
        at = holder[node]
        placement = placed.get(at)
        if placement is None:
            chain = chains[at]
            assert chain is not None  # every chain was made above
            placement = placed[at] = Placement(tiers=chain[:-1], tors=chain[-1:])
        placements[node] = placement
    return placements


def resolve(
    hypernodes: Sequence[HyperNode],
    nodes: Sequence[NodeFacts],
    source: str,
    *,
    names: Optional[Iterable[str]] = None,
) -> Resolved:
    """Each node's place in the tree of ``hypernodes``.

    ``nodes`` give the labels for ``labelMatch`` and the names ``regexMatch`` is tried on.
    ``names`` (node names) limits the work to the nodes that matter (a job's); they are matched by
    name even when ``nodes`` does not list them. Without ``names``, every node ``nodes`` lists or
    an ``exactMatch`` names is placed.
    """
    by_name = {hypernode.name: hypernode for hypernode in hypernodes}
    ordered = sorted(by_name.values(), key=lambda h: id_sort_key(h.name))
    notes: List[str] = []
    parent = _parents(ordered, by_name, notes)
    _check_acyclic(ordered, by_name, source)
    _check_depth(ordered, by_name, parent, source)
    facts = {node.name: node for node in nodes}
    if names is None:
        exact = {m.exact for h in ordered for m in h.members if m.type == "Node" and m.exact}
        candidates = set(facts) | exact
    else:
        candidates = set(names)  # in any order: the results are per node
    holders = _holders(ordered, candidates, facts, names is not None, notes, source)
    chains: Dict[str, Optional[Tuple[str, ...]]] = {}
    placements: Dict[str, Placement] = {}
    # the same HyperNodes hold many nodes (a leaf, all its nodes): their paths, worked out once
    known: Dict[Any, Tuple[Tuple[Tuple[str, ...], ...], Placement]] = {}
    paths: Dict[str, Tuple[Tuple[str, ...], ...]] = {}
    several: List[str] = []
    for node in sorted(holders):  # the nodes some HyperNode holds (of the candidates)
        held_by = holders[node]
        key = held_by[0] if len(held_by) == 1 else tuple(held_by)
        found = known.get(key)
        if found is None:
            options: List[Tuple[str, ...]] = []
            for holder in held_by:
                chain = _chain(holder, parent, chains)
                assert chain is not None  # _check_acyclic has refused every cycle
                options.append(chain)
            if len(options) > 1:
                options.sort(
                    key=lambda chain: (by_name[chain[-1]].tier, tuple(map(id_sort_key, chain)))
                )
            chosen = options[0]
            found = known[key] = (
                tuple(options),
                Placement(tiers=chosen[:-1], tors=chosen[-1:]),
            )
        paths[node], placements[node] = found
        if len(found[0]) > 1:
            several.append(f"{shown(node)} ({', '.join(_path_text(c) for c in found[0])})")
    if several:
        notes.append(
            f"{len(several)} node(s) are held by several HyperNodes, each placed under the one of "
            f"the lowest tier, then by path (first listed): {_few(several)}"
        )
    return Resolved(placements, paths, tuple(notes))


def _parents(
    ordered: Sequence[HyperNode], by_name: Mapping[str, HyperNode], notes: List[str]
) -> Dict[str, str]:
    """Each HyperNode's parent: of several, the one of the lowest tier, then by name."""
    claims: Dict[str, List[HyperNode]] = {}
    ignored: List[str] = []
    for hypernode in ordered:
        for member in hypernode.members:
            if member.type != "HyperNode":
                continue
            if member.exact is None:
                ignored.append(f"{shown(hypernode.name)} {member.path}")
            elif member.exact in by_name:
                claimed = claims.setdefault(member.exact, [])
                if not claimed or claimed[-1] is not hypernode:  # listed twice in one HyperNode
                    claimed.append(hypernode)
    if ignored:
        notes.append(
            "HyperNode members chosen by regexMatch or labelMatch are ignored (Volcano "
            f"takes HyperNode members by exactMatch only): {_few(ignored)}"
        )
    parent: Dict[str, str] = {}
    shared: List[str] = []
    for child in sorted(claims, key=id_sort_key):
        candidates = sorted(claims[child], key=lambda h: (h.tier, id_sort_key(h.name)))
        parent[child] = candidates[0].name
        if len(candidates) > 1:
            shared.append(f"{shown(child)} (in {', '.join(shown(c.name) for c in candidates)})")
    if shared:
        notes.append(
            f"{len(shared)} HyperNode(s) are members of several HyperNodes, each kept "
            f"under the one of the lowest tier, then by name (first listed): "
            f"{_few(shared)}"
        )
    return parent


def _check_acyclic(
    ordered: Sequence[HyperNode], by_name: Mapping[str, HyperNode], source: str
) -> None:
    """A HyperNode that contains itself through its members is an error (Volcano: "cyclic
    dependency detected"), named at the member that closes the cycle."""
    state: Dict[str, int] = {}  # 1: on the current walk, 2: done
    for root in ordered:
        if root.name in state:
            continue
        stack: List[Tuple[HyperNode, int]] = [(root, 0)]
        trail: List[str] = [root.name]
        state[root.name] = 1
        while stack:
            hypernode, position = stack.pop()
            members = hypernode.members
            while position < len(members):
                member = members[position]
                position += 1
                child = by_name.get(member.exact or "") if member.type == "HyperNode" else None
                if child is None or state.get(child.name) == 2:
                    continue
                if state.get(child.name) == 1:
                    cycle = trail[trail.index(child.name) :]
                    named = " > ".join(map(shown, cycle[:CYCLE_NAMED]))
                    if len(cycle) > CYCLE_NAMED:
                        named += f" > ... ({len(cycle)} HyperNodes in all)"
                    fail(
                        source,
                        hypernode.field(f"{member.path}.selector.exactMatch.name"),
                        f"HyperNodes that form a tree; {named} > {shown(child.name)} is a cycle",
                    )
                stack.append((hypernode, position))
                stack.append((child, 0))
                trail.append(child.name)
                state[child.name] = 1
                break
            else:
                state[hypernode.name] = 2
                trail.pop()


def _check_depth(
    ordered: Sequence[HyperNode],
    by_name: Mapping[str, HyperNode],
    parent: Mapping[str, str],
    source: str,
) -> None:
    """A HyperNode more than :data:`MAX_DEPTH` from its root is an error, named at the member
    of its parent that lists the first one too deep (the tree is acyclic by now)."""
    depth: Dict[str, int] = {}
    for hypernode in ordered:
        walk: List[str] = []
        current: Optional[str] = hypernode.name
        while current is not None and current not in depth:
            walk.append(current)
            current = parent.get(current)
        above = 0 if current is None else depth[current]
        for name in reversed(walk):
            above += 1
            depth[name] = above
    too_deep = sorted((n for n, d in depth.items() if d == MAX_DEPTH + 1), key=id_sort_key)
    if too_deep:
        child = too_deep[0]
        holder = by_name[parent[child]]
        member = next(m for m in holder.members if m.type == "HyperNode" and m.exact == child)
        fail(
            source,
            holder.field(f"{member.path}.selector.exactMatch.name"),
            f"HyperNodes nested at most {MAX_DEPTH} deep; {shown(child)} is "
            f"{MAX_DEPTH + 1} deep, the deepest {max(depth.values())}",
        )


def _holders(
    ordered: Sequence[HyperNode],
    candidates: AbstractSet[str],
    facts: Mapping[str, NodeFacts],
    restricted: bool,
    notes: List[str],
    source: str,
) -> Dict[str, List[str]]:
    """node name -> the HyperNodes whose Node members select it, in name order."""
    wanted = candidates
    holders: Dict[str, List[str]] = {}
    unusable: List[str] = []
    unlabelled: List[str] = []
    programs: Dict[str, Union[goregexp.Program, str]] = {}
    budget = goregexp.Budget(MAX_MATCH_STEPS)
    in_order = sorted(candidates)

    def hold(node: str, hypernode: HyperNode) -> None:
        listed = holders.setdefault(node, [])
        if not listed or listed[-1] != hypernode.name:
            listed.append(hypernode.name)

    for hypernode in ordered:
        for member in hypernode.members:
            if member.type != "Node":
                continue
            if member.exact is not None:
                if not restricted or member.exact in wanted:
                    hold(member.exact, hypernode)
            elif member.pattern is not None:
                compiled = programs.get(member.pattern)
                if compiled is None:
                    compiled = programs[member.pattern] = _compile(member.pattern)
                if isinstance(compiled, str):
                    unusable.append(f"{shown(hypernode.name)} {member.path} ({compiled})")
                    continue
                try:
                    for node in in_order:  # the same steps, whatever the set's order
                        if compiled.search(node, budget):
                            hold(node, hypernode)
                except goregexp.BudgetExceeded:
                    fail(
                        source,
                        hypernode.field(f"{member.path}.selector.regexMatch.pattern"),
                        f"patterns that npu-job can match against {len(candidates)} node "
                        f"name(s) within {MAX_MATCH_STEPS} steps in all",
                    )
            elif member.labels is not None:
                problem = _selector_problem(member.labels)
                if problem is not None:
                    unusable.append(f"{shown(hypernode.name)} {member.path} ({problem})")
                    continue
                if any(node not in facts for node in candidates):
                    unlabelled.append(f"{shown(hypernode.name)} {member.path}")
                for node in candidates:
                    known = facts.get(node)
                    if known is not None and all(r.matches(known.labels) for r in member.labels):
                        hold(node, hypernode)
    if unusable:
        notes.append(f"HyperNode members that select no node (as in Volcano): {_few(unusable)}")
    if unlabelled:
        notes.append(
            "labelMatch members cannot select nodes whose labels were not given "
            f"(kubectl get nodes -o json): {_few(unlabelled)}"
        )
    return holders


def _compile(pattern: str) -> Union[goregexp.Program, str]:
    """The compiled pattern, or why it selects nothing here."""
    try:
        return goregexp.compile(pattern)
    except goregexp.RegexpError as error:  # Volcano: klog.ErrorS, and no member
        return f"invalid pattern: {shown(str(error))}"
    except goregexp.Unsupported as error:
        return f"not matched by npu-job: {error}"


def _selector_problem(requirements: Tuple[Requirement, ...]) -> Optional[str]:
    if not requirements:
        return "an empty labelMatch"
    for requirement in requirements:
        problem = requirement.problem()
        if problem is not None:
            return problem
    return None


def _chain(
    holder: str, parent: Mapping[str, str], chains: Dict[str, Optional[Tuple[str, ...]]]
) -> Optional[Tuple[str, ...]]:
    """The HyperNodes from the root down to ``holder`` by ``parent`` (memoised in ``chains``);
    None when the walk up meets itself (a cycle) or goes past :data:`MAX_DEPTH`."""
    walk: List[str] = []
    current: Optional[str] = holder
    while current is not None and current not in chains:
        chains[current] = None  # on this walk: met again, it closes a cycle
        walk.append(current)
        if len(walk) > MAX_DEPTH:  # too deep (resolve says so): no path is made
            return None
        current = parent.get(current)
    tail: Optional[Tuple[str, ...]] = () if current is None else chains[current]
    if tail is None or len(tail) + len(walk) > MAX_DEPTH:
        return None
    for name in reversed(walk):
        tail = tail + (name,)
        chains[name] = tail
    return tail


def _path_text(chain: Sequence[str]) -> str:
    return " > ".join(map(shown, chain))


def _few(items: Sequence[str]) -> str:
    listed = "; ".join(items[:NOTES_LISTED])
    more = len(items) - NOTES_LISTED
    return listed + (f"; and {more} more" if more > 0 else "")
