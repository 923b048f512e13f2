"""Safe YAML parsing that remembers where every key and value came from.

The first step of loading desired state: bytes of one spec or marker file become
plain JSON-compatible data (dicts, lists, str, int, float, bool, None) plus a map
from paths (tuples of keys and list indexes) to 1-based (line, column), so later
validation errors can name ``file:line:column``.

Only the node tree is built (``yamlevents``: libyaml's parser when available, no
recursion); nothing is ever constructed from a tag. Everything a person could get
wrong, or an attacker could try, becomes a ``SpecProblem``: files over 1 MiB (checked
before parsing), binary or non-UTF-8 bytes, tabs, malformed YAML, tags other than the
plain safe ones, duplicate keys, alias expansion bombs, nesting deeper than
``yamlevents.MAX_DEPTH``, several documents, empty files and
documents that are not a mapping. YAML timestamps are kept as the text written,
because the schema treats them as strings.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from reconciler.errors import SpecInvalid, SpecProblem
from reconciler.spec.yamlevents import (
    HAVE_LIBYAML,
    MAX_DEPTH,
    AliasUse,
    SecondDocument,
    TooDeep,
    compose_single,
)

MAX_BYTES = 1 << 20  # 1 MiB: a spec is a few hundred bytes
MAX_NODES = 10_000  # node visits, aliases expanded: a spec has a few dozen

YamlPath = tuple[str | int, ...]
LineCol = tuple[int, int]  # 1-based line, column

_STD = "tag:yaml.org,2002:"
_PLAIN_SCALARS = {f"{_STD}{t}" for t in ("str", "null", "bool", "int", "float", "timestamp")}
_NOT_JSON = {f"{_STD}{t}" for t in ("binary", "set", "omap", "pairs", "value", "yaml")}
_MERGE = f"{_STD}merge"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class ParsedYaml:
    """One parsed file: its data and where each key and value starts."""

    path: str
    data: Any
    values: Mapping[YamlPath, LineCol] = field(default_factory=dict)
    keys: Mapping[YamlPath, LineCol] = field(default_factory=dict)

    def value_position(self, path: YamlPath) -> tuple[int | None, int | None]:
        """Where the value at ``path`` starts, else its nearest recorded ancestor."""
        path = tuple(path)
        while True:
            if path in self.values:
                return self.values[path]
            if path in self.keys:
                return self.keys[path]
            if not path:
                return (None, None)
            path = path[:-1]

    def key_position(self, path: YamlPath) -> tuple[int | None, int | None]:
        """Where the key naming ``path`` starts (the value's position for list items)."""
        path = tuple(path)
        if path in self.keys:
            return self.keys[path]
        return self.value_position(path)


def format_field(path: YamlPath) -> str:
    """``("dataSchema", "metrics", 1, "field")`` -> ``dataSchema.metrics[1].field``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def read_limited(
    path: str | os.PathLike[str], display: str, *, max_bytes: int = MAX_BYTES
) -> bytes:
    """The bytes of a file, refusing files over ``max_bytes`` before reading them."""
    try:
        # O_NONBLOCK: a FIFO named like a spec must not hang the tick in open().
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise _invalid(
                    display, "not a regular file (a FIFO, device or socket); specs are plain files"
                )
            size = st.st_size
            if size > max_bytes:
                raise _invalid(
                    display,
                    f"file is {_size(size)}; spec and marker files are limited to {_size(max_bytes)}",
                )
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise _invalid(display, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # grew while we read it
        raise _invalid(
            display,
            f"file is over {_size(max_bytes)}; spec and marker files are limited to {_size(max_bytes)}",
        )
    return data


def parse_yaml(
    data: bytes | str,
    path: str,
    *,
    allow_empty: bool = False,
    max_bytes: int = MAX_BYTES,
    max_nodes: int = MAX_NODES,
) -> ParsedYaml:
    """Parse one YAML document that must be a mapping; raise ``SpecInvalid`` otherwise.

    With ``allow_empty`` an empty file (or one holding only comments) is ``{}``;
    without it, it is a problem.
    """
    text = _decode(
        data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"), path, max_bytes
    )
    root = _compose(text, path)
    if root is None or (isinstance(root, ScalarNode) and root.tag == f"{_STD}null"):
        if allow_empty:
            return ParsedYaml(path=path, data={})
        raise _invalid(
            path,
            "file is empty; a spec is a mapping such as 'id: clicks' with source and dataSchema",
        )
    builder = _Builder(path, max_nodes)
    data_out = builder.build(root)
    if builder.problems:
        raise SpecInvalid(sorted(builder.problems, key=_order))
    if not isinstance(data_out, dict):
        line, col = builder.values[()]
        kind = "a list" if isinstance(data_out, list) else f"a single value ({_short(data_out)})"
        raise _invalid(
            path, f"the document must be a mapping of 'key: value' lines, not {kind}", line, col
        )
    return ParsedYaml(
        path=path,
        data=data_out,
        values=MappingProxyType(builder.values),
        keys=MappingProxyType(builder.keys),
    )


def _compose(text: str, path: str) -> Node | None:
    """The root node: libyaml first; on any error the pure-Python parser again, whose
    messages and positions are the ones people (and the corpus) know."""
    if HAVE_LIBYAML:
        try:
            return compose_single(text, libyaml=True)
        except (yaml.YAMLError, RecursionError):
            pass  # explained by the pure-Python parser below
        except (TooDeep, SecondDocument) as exc:
            raise _structure_problem(exc, path) from None
    return _explain(text, path)


def _explain(text: str, path: str) -> Node | None:
    try:
        return compose_single(text, libyaml=False)
    except (TooDeep, SecondDocument) as exc:
        raise _structure_problem(exc, path) from None
    except yaml.MarkedYAMLError as exc:
        raise _invalid(path, *_describe_yaml_error(exc, text)) from None
    except yaml.reader.ReaderError as exc:
        line, col = _line_col(text, exc.position)
        code = ord(exc.character) if isinstance(exc.character, str) else int(exc.character)
        raise _invalid(path, f"control character U+{code:04X} is not allowed in YAML", line, col) from None
    except RecursionError:  # a last guard: the composer does not recurse, but a parser might
        raise _invalid(path, f"the document is nested too deeply (more than {MAX_DEPTH} levels)") from None


def _structure_problem(exc: TooDeep | SecondDocument, path: str) -> SpecInvalid:
    line, col = exc.mark.line + 1, exc.mark.column + 1
    if isinstance(exc, SecondDocument):
        return _invalid(path, "a second YAML document starts here; a file holds exactly one document "
                        "(one supervisor per file)", line, col)
    return _invalid(path, f"the document is nested more than {exc.limit} levels deep here (specs and "
                    "markers need a few); refused before it can exhaust the parser", line, col)


_Alias = AliasUse


_CONSTRUCTOR = SafeConstructor()  # only its scalar constructors are used: they keep no state


class _TooBig(Exception):
    pass


class _Builder:
    """Turns a composed node tree into plain data, positions and problems."""

    def __init__(self, path: str, max_nodes: int):
        self.path = path
        self.max_nodes = max_nodes
        self.visits = 0
        self.values: dict[YamlPath, LineCol] = {}
        self.keys: dict[YamlPath, LineCol] = {}
        self.problems: list[SpecProblem] = []
        self._active: set[int] = set()
        self._outer_alias: tuple[Any, YamlPath] | None = None  # where an expansion began
        self._constructor = _CONSTRUCTOR

    def build(self, root: Node) -> Any:
        try:
            return self._node(root, ())
        except _TooBig:
            return None

    def _problem(self, mark: Any, at: YamlPath, message: str) -> None:
        self.problems.append(
            SpecProblem(self.path, mark.line + 1, mark.column + 1, format_field(at), message)
        )

    def _node(self, node: Node | _Alias, at: YamlPath) -> Any:
        self.visits += 1
        if self.visits > self.max_nodes:
            mark, where = self._outer_alias or (node.start_mark, at)
            self._problem(
                mark,
                where,
                f"the document expands to more than {self.max_nodes} values "
                "(anchors and aliases used as a 'billion laughs' bomb?)",
            )
            raise _TooBig
        if len(at) > MAX_DEPTH:  # aliases inside aliases nest deeper than the text does
            mark, where = self._outer_alias or (node.start_mark, at)
            self._problem(mark, where, f"the document expands to more than {MAX_DEPTH} levels of nesting")
            raise _TooBig
        self.values.setdefault(at, _pos(node.start_mark))
        if not isinstance(node, _Alias):
            return self._node_body(node, at)
        if id(node.target) in self._active:
            self._problem(node.start_mark, at, "recursive alias: an anchor cannot contain itself")
            raise _TooBig
        outermost = self._outer_alias is None
        if outermost:
            self._outer_alias = (node.start_mark, at)
        try:
            return self._node_body(node.target, at)
        finally:
            if outermost:
                self._outer_alias = None

    def _node_body(self, node: Node, at: YamlPath) -> Any:
        if isinstance(node, ScalarNode):
            return self._scalar(node, at)
        if not self._tag_ok(
            node, at, f"{_STD}seq" if isinstance(node, SequenceNode) else f"{_STD}map"
        ):
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return [self._node(item, (*at, i)) for i, item in enumerate(node.value)]
            assert isinstance(node, MappingNode)
            return self._mapping(node, at)
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: MappingNode, at: YamlPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node, at)
            if key is None:
                continue
            mark = key_node.start_mark
            if key in first_line:
                self._problem(
                    mark,
                    (*at, key),
                    f"duplicate key '{key}' (first defined on line {first_line[key]})",
                )
                continue
            first_line[key] = mark.line + 1
            self.keys[(*at, key)] = _pos(mark)
            out[key] = self._node(value_node, (*at, key))
        return out

    def _key(self, key_node: Node | _Alias, at: YamlPath) -> str | None:
        self.visits += 1
        target = key_node.target if isinstance(key_node, _Alias) else key_node
        if not isinstance(target, ScalarNode):
            self._problem(
                key_node.start_mark, at, "a key must be a plain value, not a mapping or a list"
            )
            return None
        if target.tag == _MERGE:
            self._problem(
                key_node.start_mark, at, "merge keys (<<) are not supported; write the keys out"
            )
            return None
        if not self._tag_ok(target, at, None):
            return None
        return str(target.value)

    def _scalar(self, node: ScalarNode, at: YamlPath) -> Any:
        if not self._tag_ok(node, at, None):
            return None
        tag = node.tag
        if tag in (f"{_STD}str", f"{_STD}timestamp"):
            return node.value  # timestamps stay the text written; the schema wants strings
        try:
            return self._constructor.yaml_constructors[tag](self._constructor, node)
        except (ValueError, TypeError, yaml.constructor.ConstructorError):
            kind = tag.removeprefix(_STD)
            self._problem(node.start_mark, at, f"{node.value!r} is not a valid {kind}")
            return None

    def _tag_ok(self, node: Node, at: YamlPath, expected: str | None) -> bool:
        tag = node.tag
        if tag == expected or (expected is None and tag in _PLAIN_SCALARS):
            return True
        shown = "!!" + tag.removeprefix(_STD) if tag.startswith(_STD) else tag
        if tag in _NOT_JSON or tag in _PLAIN_SCALARS or tag in (f"{_STD}seq", f"{_STD}map"):
            message = f"YAML tag {shown} is not supported here (specs hold plain values, lists and mappings)"
        else:
            message = f"YAML tag {shown} is not allowed (safe YAML only)"
        self._problem(node.start_mark, at, message)
        return False


def _decode(data: bytes, path: str, max_bytes: int) -> str:
    if len(data) > max_bytes:
        raise _invalid(
            path,
            f"file is {_size(len(data))}; spec and marker files are limited to {_size(max_bytes)}",
        )
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise _invalid(
            path, f"binary data, not YAML text: NUL byte at byte offset {nul} (line {line})"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _invalid(
            path,
            f"not UTF-8: byte 0x{data[exc.start]:02x} at byte offset {exc.start} (line {line}) "
            "cannot be decoded; save the file as UTF-8",
        ) from None
    return text.removeprefix("\ufeff")


def _describe_yaml_error(
    exc: yaml.MarkedYAMLError, text: str
) -> tuple[str, int | None, int | None]:
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
    problem = exc.problem or exc.context or "malformed YAML"
    if "'\\t'" in problem:
        return (
            "tab character: YAML indents and separates with spaces only (replace tabs with spaces)",
            line,
            col,
        )
    if exc.context == "while scanning a simple key" and exc.context_mark is not None and mark is not None \
            and exc.context_mark.line < mark.line:
        # PyYAML notices the missing ':' only on the next line; the typo is where the key started
        return (
            f"malformed YAML: could not find expected ':' after the key on this line (a key needs ': ' "
            f"before its value; the parser noticed on line {mark.line + 1})",
            exc.context_mark.line + 1,
            exc.context_mark.column + 1,
        )
    start = _swallowing_scalar(text, mark) if problem == "mapping values are not allowed here" else None
    if start is not None:
        return (
            f"malformed YAML: {problem}: the value starting here runs on to line {mark.line + 1}, "
            f"where a ':' follows (is a ':' missing on this line, or line {mark.line + 1} indented too deep? a "
            f"value that holds ': ' is quoted)",
            start.line + 1,
            start.column + 1,
        )
    message = f"malformed YAML: {problem}"
    if exc.context and exc.problem:
        message += f" ({exc.context}"
        if exc.context_mark is not None and exc.context_mark is not mark:
            message += f" started on line {exc.context_mark.line + 1}"
        message += ")"
    return message, line, col


def _swallowing_scalar(text: str, mark: Any) -> Any:
    """The start of a plain value that spans lines and ends where ``mark`` is (it took in the
    next line's key, so PyYAML reports the ':' after it), else None."""
    last = None
    try:
        for token in yaml.scan(text):
            last = token
    except yaml.YAMLError:
        pass  # the error being explained: the tokens before it are what is needed
    # only a value that took in the very next line: one wrapped over more lines is prose whose
    # later line holds a ': ' of its own (quote it), and PyYAML's own mark, on that ': ', is right
    if (isinstance(last, yaml.ScalarToken) and last.plain and mark is not None
            and last.start_mark.line + 1 == last.end_mark.line == mark.line):
        return last.start_mark
    return None


def _invalid(
    path: str, message: str, line: int | None = None, column: int | None = None
) -> SpecInvalid:
    return SpecInvalid([SpecProblem(path, line, column, "", message)])


def _order(p: SpecProblem) -> tuple[int, int, str]:
    return (p.line or 0, p.column or 0, p.message)


def _pos(mark: Any) -> LineCol:
    return (mark.line + 1, mark.column + 1)


def _line_col(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _size(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n} bytes"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
