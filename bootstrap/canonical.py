"""Canonical forms that every pod computes identically: id sort keys, switch paths and digests.

Every pod of a job plans alone, so whatever the planner sorts or hashes must be a pure function of
what the inputs *mean*, never of how they happened to arrive (dict order of an API response,
device order inside a server, ``hash()`` salt, timestamps). This module owns those canonical forms:

* :func:`id_sort_key` — a total order on switch and server ids: IPv4/IPv6 addresses compare as
  numbers (``10.0.0.9`` before ``10.0.0.10``), anything else in natural order (``tor-2`` before
  ``tor-10``); the raw string ends every key so distinct ids never tie.
* :func:`switch_path` — a server's effective placement: the rank table's super pod (v1.2) as the
  outermost tier, then the topology's tiers, then its ToRs.
* :func:`canonical_input` / :func:`input_digest` — the sha256 of (servers in pod order with ids
  and device counts, their placements, the collective), logged by every pod.
* :func:`mapping_digest` — the sha256 of a plan's ``newRank-podIndex`` mapping.
"""

from __future__ import annotations

import json
import re
from itertools import repeat
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, Union, cast

from .base.jsondecode import encode_compact
from .base.model import Collective, Placement, RankTable, Server, Topology

# Start-up matters on the pod (the bootstrap runs before training): take sha256 and
# inet_aton/inet_ntoa from the C modules themselves. ``hashlib`` would load OpenSSL's libcrypto
# (~2.5 ms, 11 M instructions) and ``socket`` builds its enums (~2.5 ms); the functions are the
# same ones. ``sha256`` is the pod side's one sha256.
try:
    from _sha2 import sha256  # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.7-3.11
    except ImportError:  # an interpreter built without its own hashes
        from hashlib import sha256
try:
    from _socket import inet_aton as _inet_aton
    from _socket import inet_ntoa as _inet_ntoa
except ImportError:
    from socket import inet_aton as _inet_aton
    from socket import inet_ntoa as _inet_ntoa
if TYPE_CHECKING:  # typing.Literal is Python 3.8+; the pod side runs on 3.7
    from typing import Literal  # novermin: for the type checker only
_BIG: Literal["big"] = "big"  # novermin: int.from_bytes' byte order, typed as it accepts it

# (kind, ...) tuples; kind 0 = IP address (then version, integer value), kind 1 = natural order.
IdKey = Tuple[Union[int, str, Tuple[Union[str, Tuple[int, str]], ...]], ...]

_DIGITS = re.compile(r"(\d+)", re.ASCII)
SwitchPath = Tuple[Tuple[str, ...], Tuple[str, ...], Optional[int]]  # (tiers, tors, slot)


def id_sort_key(identifier: str) -> IdKey:
    """A total sort key for a server or switch id: IPs numerically, other ids naturally.

    IPv4 (canonical dotted quad, no leading zeros) sorts before IPv6, addresses before any other
    id; ties between spellings that mean the same number (``"07"`` and ``"7"``, ``"::1"`` and
    ``"0::1"``) are broken by the raw string so the order is total.
    """
    try:
        packed: Optional[bytes] = _inet_aton(identifier)
    except (OSError, ValueError):
        packed = None
    # Only the canonical dotted quad counts as an address (inet_aton also takes "10.1", octal, hex).
    if packed is not None and _inet_ntoa(packed) == identifier:
        return (0, 4, int.from_bytes(packed, "big"), identifier)
    if ":" in identifier:
        import ipaddress  # only IPv6 ids pay for this import

        try:
            return (0, 6, int(ipaddress.IPv6Address(identifier)), identifier)
        except ValueError:
            pass
    pieces = _DIGITS.split(identifier)  # [text, digits, text, digits, ..., text]
    natural = tuple(
        _number_key(piece) if index % 2 else piece for index, piece in enumerate(pieces)
    )
    return (1, natural, identifier)


def _number_key(digits: str) -> Tuple[int, str]:
    """Orders runs of ASCII digits by the number they spell, as ``int(digits)`` would, for any
    length (``int()`` refuses more than 4300 digits): fewer significant digits first, then
    digit by digit."""
    significant = digits.lstrip("0")
    return (len(significant), significant)


def id_order(identifiers: Sequence[str]) -> List[int]:
    """Positions of ``identifiers`` sorted by :func:`id_sort_key` (ties keep their order).

    The usual job names its servers by canonical IPv4 addresses: then the addresses' integer
    values are the whole key (distinct canonical spellings are distinct numbers), computed and
    compared at C speed; anything else goes through :func:`id_sort_key`.
    """
    try:
        packed = list(map(_inet_aton, identifiers))
    except (OSError, ValueError, TypeError):
        packed = None
    if packed is not None and _all_dotted_quads(identifiers):
        keys: Sequence[Any] = list(map(int.from_bytes, packed, repeat(_BIG)))
    else:
        keys = list(map(id_sort_key, identifiers))
    return sorted(range(len(keys)), key=keys.__getitem__)


_NONZERO_AS_ONE = str.maketrans("23456789", "11111111")


def _all_dotted_quads(identifiers: Sequence[str]) -> bool:
    """Whether ids that inet_aton reads are all canonical dotted quads (``_inet_ntoa(packed) ==
    id`` for each): ASCII digits and three dots each, no number with a leading zero. Checked over
    the joined text in a few passes of C (a fifth of formatting each address back)."""
    count = len(identifiers)
    text = "." + ".".join(identifiers)  # every number now follows a dot
    if text.count(".") != 4 * count:  # three dots each, as inet_aton reads at most four parts
        return False
    digits = text.translate(_NONZERO_AS_ONE)  # "0" stays, so a leading zero is ".0" + digit
    return (
        digits.count("0") + digits.count("1") + 4 * count == len(digits)  # nothing else
        and ".00" not in digits
        and ".01" not in digits
    )


# The addresses of a server a topology may be keyed by, in the order they are tried: MindCluster
# and HCCL tables often name servers (node_0, a hostname) and carry the address in host_ip or
# container_ip, while ToR sources key servers by address.
ADDRESS_FIELDS = ("server_id", "host_ip", "container_ip")


def topology_entry(
    server: Server, topology: Optional[Topology]
) -> Tuple[Optional[str], Optional[Placement]]:
    """``(field, placement)``: the first of :data:`ADDRESS_FIELDS` whose value the topology
    places, or ``(None, None)``."""
    if topology is None:
        return None, None
    placement = topology.placement_of(server.server_id)
    if placement is not None:
        return "server_id", placement
    for field in ADDRESS_FIELDS[1:]:
        address = getattr(server, field)
        if address:
            placement = topology.placement_of(address)
            if placement is not None:
                return field, placement
    return None, None


def switch_path(server: Server, topology: Optional[Topology]) -> SwitchPath:
    """``(tiers, tors, slot)`` of ``server``: its super pod (if any) outermost, then the topology's.

    A server with neither a topology entry nor a super pod has ``((), (), None)``: no placement.
    """
    placement: Optional[Placement] = topology_entry(server, topology)[1]
    tiers: Tuple[str, ...] = placement.tiers if placement else ()
    tors: Tuple[str, ...] = placement.tors if placement else ()
    slot = placement.slot if placement else None
    if server.super_pod_id is not None and (not tiers or tiers[0] != server.super_pod_id):
        tiers = (server.super_pod_id,) + tiers
    return tiers, tors, slot


def switch_paths(table: RankTable, topology: Optional[Topology]) -> Tuple[SwitchPath, ...]:
    """:func:`switch_path` of every server, in pod order."""
    servers = table.servers
    if topology is not None and all(server.super_pod_id is None for server in servers):
        # The usual job: the topology places every server by its id, and no super pod adds a
        # tier; then the paths are the placements' own, looked up at C speed.
        placements = list(map(topology.placements.get, [server.server_id for server in servers]))
        if all(placements):  # a Placement is always true, a miss is None
            found = cast(List[Placement], placements)
            return tuple([(place.tiers, place.tors, place.slot) for place in found])
    return tuple([switch_path(server, topology) for server in servers])


def canonical_input(
    table: RankTable,
    topology: Optional[Topology],
    collective: Collective,
    paths: Optional[Sequence[SwitchPath]] = None,
) -> bytes:
    """The bytes every pod hashes: servers in pod order (id, device count, switch path), collective.

    Only what the planner reads goes in, so topology entries for servers outside the job, device
    order inside a server and dict order of the topology do not change the digest. ``paths`` may
    pass precomputed :func:`switch_paths`.
    """
    if paths is None:
        paths = switch_paths(table, topology)
    servers = [
        (
            server.pod_index,
            server.server_id,
            device_count,
            tiers,
            tors,
            slot,
        )  # tuples dump as lists
        for server, device_count, (tiers, tors, slot) in zip(
            table.servers, table.device_counts, paths
        )
    ]
    return ascii_json({"collective": collective.value, "servers": servers})


def ascii_json(document: Any) -> bytes:
    """``json.dumps(document, separators=(",", ":"), ensure_ascii=True)``, byte for byte, for a
    document of str, int, None, lists, tuples and dicts.

    msgspec's compact encoding (ten times faster) is taken when a big input has loaded it and it
    wrote printable ASCII only: the two encoders write such documents alike and differ only where
    ``json.dumps`` escapes, non-ASCII and DEL (``\\u007f``); anything else is encoded again by the
    standard library, so the digest never depends on which encoder ran.
    """
    encoded = encode_compact(document)
    if encoded.isascii() and b"\x7f" not in encoded:
        return encoded
    return json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def input_digest(
    table: RankTable,
    topology: Optional[Topology],
    collective: Collective,
    paths: Optional[Sequence[SwitchPath]] = None,
) -> str:
    """sha256 hex of :func:`canonical_input`."""
    return sha256(canonical_input(table, topology, collective, paths)).hexdigest()


def mapping_digest(rank_mapping: str) -> str:
    """sha256 hex of a plan's ``"newRank-podIndex,..."`` mapping string."""
    return sha256(rank_mapping.encode("ascii")).hexdigest()
