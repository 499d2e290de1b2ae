"""Reading one spec value: its type, how a ``--set`` value of that type reads, and its problems.

The :class:`Checker` reads typed values out of the merged tree (``values.py``) and records one
problem per bad value, with its key path and the input that set it, so that validation lists
every problem at once. A ``--set`` value (:class:`~npu_job.render.values.SetScalar`) is read as
the text written where a string is expected and as helm's typed reading where an integer or a
boolean is: ``--set env.DEBUG=true`` is the string ``"true"``, ``--set nodes=6`` the integer 6.

The key types (:class:`Text`, :class:`Integer`, :class:`Flag`, :class:`Choice`, :class:`Named`,
:class:`Quantity`, :class:`TextList`, :class:`TextMap`) are what the spec's key table
(``keys.SPEC_KEYS``) gives each key: a type reads a value with the checker and names itself for
the type column of docs/render.md's key table; :class:`Volumes` and :class:`Mounts` read
Kubernetes volumes and their mounts. :class:`PerDevice` is a value that differs by ``device``
(a bound, a default). Kubernetes' name rules live here too: the types and the spec's lists
check them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
)

from npu_job.errors import LISTED_PROBLEMS, shown

from .values import MergedValues, Path, SetScalar, format_path, typed

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ABSOLUTE_PATH = re.compile(r"/[^\x00-\x1f\x7f]*\Z")
_QUANTITY = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i|[numkMGTPE])?\Z")

DNS_LABEL_RULE = (
    "a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or "
    "digit, at most 63 characters"
)
DNS_SUBDOMAIN_RULE = "a DNS-1123 subdomain: DNS-1123 labels joined by '.', at most 253 characters"


def describe(value: Any) -> str:
    """A value as a problem names it: ``'x'``, ``3 (a number)``, ``a mapping``."""
    if isinstance(value, SetScalar):
        return repr(value.raw)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57] + "...")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


class Checker:
    """Reads typed values out of the merged tree, recording a problem for each bad one."""

    def __init__(self, merged: MergedValues) -> None:
        self.merged = merged
        self.problems: List[str] = []
        self.suggested: set = set()  # key paths a did-you-mean already named

    def problem(self, path: Path, message: str) -> None:
        where = format_path(path)
        origin = self.merged.origin_of(path) if len(self.merged.sources) > 1 else None
        suffix = f" (from {origin})" if origin else ""
        self.problems.append(f"{where}{suffix}: {message}")

    # scalars ------------------------------------------------------------------------------

    def string(
        self,
        value: Any,
        path: Path,
        *,
        pattern: Optional[re.Pattern[str]] = None,
        rule: str = "",
        max_length: Optional[int] = None,
        allow_int: bool = False,
    ) -> Optional[str]:
        if isinstance(value, SetScalar):
            value = value.raw
        if isinstance(value, int) and not isinstance(value, bool) and allow_int:
            value = str(value)
        if not isinstance(value, str):
            hint = (
                " (quote it to keep it exactly as written)"
                if isinstance(value, (bool, int, float))
                else ""
            )
            self.problem(path, f"expected a string, got {describe(value)}{hint}")
            return None
        if re.search("[\ud800-\udfff]", value):
            self.problem(path, "is not valid UTF-8 text")
            return None
        if "\x00" in value:
            self.problem(
                path,
                "contains a NUL character, which no process argument or environment value can "
                "carry",
            )
            return None
        if pattern is not None and not pattern.match(value):
            self.problem(path, f"{describe(value)} is not {rule}")
            return None
        if max_length is not None and len(value) > max_length:
            self.problem(
                path,
                f"{describe(value)} is too long ({len(value)} characters, at most {max_length})",
            )
            return None
        return value

    def integer(self, value: Any, path: Path, low: int, high: int) -> Optional[int]:
        if isinstance(value, SetScalar):
            value = value.typed
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(path, f"expected an integer, got {describe(value)}")
            return None
        if not low <= value <= high:
            self.problem(path, f"expected an integer from {low} to {high}, got {shown(value)}")
            return None
        return value

    def boolean(self, value: Any, path: Path) -> Optional[bool]:
        if isinstance(value, SetScalar):
            value = value.typed
        if not isinstance(value, bool):
            self.problem(path, f"expected true or false, got {describe(value)}")
            return None
        return value

    def choice(self, value: Any, path: Path, choices: Sequence[str]) -> Optional[str]:
        text = self.string(value, path)
        if text is None:
            return None
        if text not in choices:
            close = difflib.get_close_matches(text, choices, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.problem(path, f"expected one of {', '.join(choices)}; got {text!r}{hint}")
            return None
        return text

    def quantity(self, value: Any, path: Path) -> Optional[str]:
        if isinstance(value, SetScalar):
            value = value.raw
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        return self.string(
            value, path, pattern=_QUANTITY, rule="a Kubernetes quantity such as 16, 500m, 64Gi"
        )

    # containers ---------------------------------------------------------------------------

    def mapping(
        self,
        value: Any,
        path: Path,
        known: Optional[Sequence[str]] = None,
        hints: Mapping[str, str] = {},
    ) -> Dict[str, Any]:
        """A mapping; with ``known``, an unknown key is a problem with a did-you-mean (or hint)."""
        if not isinstance(value, dict):
            self.problem(path, f"expected a mapping, got {describe(value)}")
            return {}
        if known is not None:
            for key in value:
                if key in known:
                    continue
                if len(self.problems) >= LISTED_PROBLEMS:  # unlisted: spare a did-you-mean per key
                    self.problem(path + (key,), "unknown key")
                    continue
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                if key in hints:
                    hint = hints[key]
                elif close:
                    hint = f"did you mean {close[0]!r}?"
                    self.suggested.add(path + (close[0],))
                else:
                    hint = f"known keys: {', '.join(known)}"
                self.problem(path + (key,), f"unknown key ({hint})")
        return value

    def required(self, mapping: Mapping[str, Any], key: str, path: Path) -> bool:
        """Whether ``key`` has a value; if not, a problem (unless a did-you-mean points here)."""
        if mapping.get(key) is not None:
            return True
        if path + (key,) not in self.suggested:
            self.problem(path + (key,), "required key is missing")
        return False

    def sequence(self, value: Any, path: Path) -> List[Any]:
        if isinstance(value, SetScalar) and value.raw == "":
            return []  # --set args= means an empty list, as `{}` does
        if not isinstance(value, list):
            self.problem(path, f"expected a list, got {describe(value)}")
            return []
        return value

    def string_list(self, value: Any, path: Path, **string_rules: Any) -> Tuple[str, ...]:
        items = [
            self.string(item, path + (i,), **string_rules)
            for i, item in enumerate(self.sequence(value, path))
        ]
        return tuple(item for item in items if item is not None)

    def string_map(
        self,
        value: Any,
        path: Path,
        *,
        key_check: Callable[[str, Path], bool],
        allow_int: bool = True,
        **value_rules: Any,
    ) -> Tuple[Tuple[str, str], ...]:
        pairs = []
        for key, item in self.mapping(value, path).items():
            if not key_check(str(key), path + (key,)):
                continue
            text = self.string(item, path + (key,), allow_int=allow_int, **value_rules)
            if text is not None:
                pairs.append((str(key), text))
        return tuple(pairs)

    # name rules ---------------------------------------------------------------------------

    def qualified_key(self, key: str, path: Path) -> bool:
        prefix, _, name = key.rpartition("/")
        bad_prefix = bool(prefix) and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))
        if bad_prefix or len(name) > 63 or not _QUALIFIED_NAME.match(name):
            self.problem(
                path,
                "not a valid key: an optional DNS-1123 subdomain and '/', then up to 63 letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit",
            )
            return False
        return True

    def env_name(self, key: str, path: Path, reserved: Mapping[str, str]) -> bool:
        if not _ENV_NAME.match(key):
            self.problem(
                path,
                "not a valid variable name: letters, digits and '_', not starting with a digit",
            )
            return False
        if key in reserved:
            self.problem(path, f"reserved: {reserved[key]}")
            return False
        return True


# --- the key types ---------------------------------------------------------------------------


class Context(Protocol):
    """What the keys read before tell a type's rule: the device (npus_per_node's bound), the
    volumes' names (which mounts may name; :class:`Volumes` sets them)."""

    volume_names: Tuple[str, ...]

    @property
    def device(self) -> str: ...


class KeyType(Protocol):
    """A spec key's type: how a value is read (and checked), and its name in docs/render.md."""

    @property
    def kind(self) -> str: ...

    #: docs/render.md's default of an empty value (a list ``[]`` or a map ``{}``)
    @property
    def empty(self) -> str: ...

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any: ...


@dataclass(frozen=True)
class PerDevice:
    """A value that differs by ``device``: ``usual``, except on the devices ``other`` names."""

    usual: Any
    other: Tuple[Tuple[str, Any], ...] = ()

    def on(self, device: str) -> Any:
        return dict(self.other).get(device, self.usual)

    def describe(self, show: Callable[[Any], str]) -> str:
        """``8 (1 for cpu)``, each value shown by ``show``."""
        devices: Dict[Any, List[str]] = {}
        for device, value in self.other:
            devices.setdefault(value, []).append(device)
        rest = "; ".join(
            f"{show(value)} for {', '.join(names)}" for value, names in devices.items()
        )
        return f"{show(self.usual)} ({rest})"


def per_device(usual: Any, **other: Any) -> PerDevice:
    """``per_device(8, cpu=1)``: 8, except 1 on cpu."""
    return PerDevice(usual, tuple(other.items()))


@dataclass(frozen=True)
class Text:
    """A string matching ``pattern`` (``rule`` says it in words); ``--set`` gives the text."""

    kind: str = "string"
    pattern: Optional[re.Pattern[str]] = None
    rule: str = ""
    max_length: Optional[int] = None
    empty: str = ""

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        return check.string(
            value, path, pattern=self.pattern, rule=self.rule, max_length=self.max_length
        )


@dataclass(frozen=True)
class Integer:
    """An integer from ``low`` to ``high`` (per device where it differs); ``--set`` types it."""

    low: int
    high: Union[int, PerDevice]
    empty: str = ""

    @property
    def kind(self) -> str:
        if isinstance(self.high, PerDevice):
            return "integer " + self.high.describe(lambda high: f"{self.low}..{high}")
        return f"integer {self.low}..{self.high}"

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        high = self.high.on(context.device) if isinstance(self.high, PerDevice) else self.high
        return check.integer(value, path, self.low, high)


@dataclass(frozen=True)
class Flag:
    """``true`` or ``false``; ``--set`` types it."""

    kind: str = "boolean"
    empty: str = ""

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        return check.boolean(value, path)


@dataclass(frozen=True)
class FlagOrInteger:
    """``true``, ``false``, or an integer from ``low`` to ``high`` (``unit`` names what it
    counts); ``--set`` types it."""

    low: int
    high: int
    unit: str = ""
    empty: str = ""

    @property
    def kind(self) -> str:
        return f"boolean or integer {self.low}..{self.high}"

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        if isinstance(value, SetScalar):
            value = value.typed
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return check.integer(value, path, self.low, self.high)
        unit = f" of {self.unit}" if self.unit else ""
        check.problem(
            path,
            f"expected true, false or an integer{unit} from {self.low} to {self.high}, "
            f"got {describe(value)}",
        )
        return None


@dataclass(frozen=True)
class Choice:
    """One of ``choices`` (a did-you-mean for a near miss); ``--set`` gives the text."""

    choices: Tuple[str, ...]
    empty: str = ""

    @property
    def kind(self) -> str:
        quoted = [f"`{choice}`" for choice in self.choices]
        return f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        return check.choice(value, path, self.choices)


@dataclass(frozen=True)
class Named:
    """A name in ``registry`` (its entries when the value is read; a did-you-mean for a near
    miss), as a :class:`Choice` of them; ``kind`` names the type where the docs list them."""

    registry: Mapping[str, Any] = field(compare=False)  # a dict: no part of the hash
    kind: str = "name"
    empty: str = ""

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        return check.choice(value, path, tuple(sorted(self.registry)))


@dataclass(frozen=True)
class Quantity:
    """A Kubernetes quantity (``16``, ``500m``, ``64Gi``); a number becomes its text."""

    kind: str = "quantity"
    empty: str = ""

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        return check.quantity(value, path)


@dataclass(frozen=True)
class TextList:
    """A list of strings (each matching ``pattern``); ``one_is_a_list``: a string is a list."""

    kind: str = "list of strings"
    allow_int: bool = False  # an integer item is written in decimal
    pattern: Optional[re.Pattern[str]] = None
    rule: str = ""
    one_is_a_list: bool = False
    empty: str = "`[]`"

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        if self.one_is_a_list and isinstance(value, (str, SetScalar)):
            value = [value]
        return check.string_list(
            value, path, allow_int=self.allow_int, pattern=self.pattern, rule=self.rule
        )


@dataclass(frozen=True)
class TextMap:
    """A map of strings (an integer value is written in decimal); its keys are Kubernetes label
    keys (``keys="label"``) or environment names (``keys="env"``, none of ``reserved``)."""

    kind: str = "map of strings"
    keys: str = "label"
    reserved: Mapping[str, str] = field(default_factory=dict, hash=False)
    pattern: Optional[re.Pattern[str]] = None
    rule: str = ""
    max_length: Optional[int] = None
    empty: str = "`{}`"

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        def env_name(key: str, key_path: Path) -> bool:
            return check.env_name(key, key_path, self.reserved)

        key_check = env_name if self.keys == "env" else check.qualified_key
        return check.string_map(
            value,
            path,
            key_check=key_check,
            pattern=self.pattern,
            rule=self.rule,
            max_length=self.max_length,
        )


@dataclass(frozen=True)
class Volumes:
    """Kubernetes volumes, passed through: a DNS-1123 ``name`` unique and not one of
    ``reserved``, and a source; their names are for :class:`Mounts` (``context.volume_names``)."""

    reserved: FrozenSet[str] = frozenset()
    kind: str = "list of volumes"
    empty: str = "`[]`"

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        names: List[str] = []
        volumes = []
        for index, item in enumerate(check.sequence(value, path)):
            where: Path = path + (index,)
            volume = check.mapping(item, where)
            if not volume:
                continue
            if not check.required(volume, "name", where):
                continue
            name = check.string(
                volume["name"],
                where + ("name",),
                pattern=DNS_LABEL,
                rule=DNS_LABEL_RULE,
                max_length=63,
            )
            if name is None:
                continue
            if name in self.reserved:
                check.problem(
                    where + ("name",), f"{name!r} is used by npu-job itself; choose another name"
                )
            elif name in names:
                check.problem(where + ("name",), f"{name!r} is declared twice")
            if len(volume) < 2:
                check.problem(
                    where,
                    "expected a volume source beside 'name' (for example hostPath, nfs, "
                    "persistentVolumeClaim)",
                )
            names.append(name)
            volumes.append(typed(volume))
        context.volume_names = tuple(names)
        return tuple(volumes)


@dataclass(frozen=True)
class Mounts:
    """volumeMounts (with only ``keys``) of the volumes read before, each path mounted once."""

    keys: Tuple[str, ...]
    kind: str = "list of volumeMounts"
    empty: str = "`[]`"

    def read(self, check: Checker, value: Any, path: Path, context: Context) -> Any:
        mounts = []
        paths: List[str] = []
        volume_names = context.volume_names
        for index, item in enumerate(check.sequence(value, path)):
            where: Path = path + (index,)
            mount = check.mapping(item, where, self.keys)
            if not mount:
                continue
            name = None
            if check.required(mount, "name", where):
                name = check.string(mount["name"], where + ("name",))
            if name is not None and name not in volume_names:
                close = difflib.get_close_matches(name, volume_names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else "declare it under volumes"
                check.problem(where + ("name",), f"{name!r} is not a volume in volumes ({hint})")
            mount_path = None
            if check.required(mount, "mountPath", where):
                mount_path = check.string(
                    mount["mountPath"],
                    where + ("mountPath",),
                    pattern=ABSOLUTE_PATH,
                    rule="an absolute path",
                )
            if mount_path is not None:
                if mount_path in paths:
                    check.problem(where + ("mountPath",), f"{mount_path!r} is mounted twice")
                paths.append(mount_path)
            if mount.get("readOnly") is not None:
                check.boolean(mount["readOnly"], where + ("readOnly",))
            for key in ("subPath", "subPathExpr", "mountPropagation"):
                if mount.get(key) is not None:
                    check.string(mount[key], where + (key,))
            mounts.append(typed(mount))
        return tuple(mounts)
