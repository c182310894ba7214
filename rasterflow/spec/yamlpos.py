"""Safe YAML loading that remembers where every key and value stands.

PyYAML's safe loader forgets positions, keeps the last of duplicate keys, expands aliases without limit and turns
``2024-06-01`` into a date. This loader composes the node graph with PyYAML's safe resolver (minus timestamps) and
builds plain Python values itself, so it can report ``file:line:column`` for any field, refuse duplicate keys, and
stop alias bombs after a bounded number of nodes.

Variables: ``${VAR}`` and ``${VAR:-default}`` in a scalar value are replaced from a mapping (the environment and
``--var``) while the node is built, so every position stays the one of the original text. A plain (unquoted) scalar
is typed after the replacement (``resolution: ${RES}`` with ``RES=10`` is the number 10); a quoted one stays a
string. ``$${X}`` is a literal ``${X}``. No other syntax is interpreted (nothing is evaluated).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

Loc = tuple[str | int, ...]
"""Where a value sits in the spec: its keys and list indices from the root."""

__all__ = ["Loc", "Position", "LoadedYaml", "YamlProblem", "load_yaml_with_positions", "substitute", "MAX_SPEC_BYTES",
           "MAX_NODES"]

MAX_SPEC_BYTES = 2 * 1024 * 1024
"""Specs are a few kB; anything over this is refused before parsing."""

MAX_NODES = 100_000
"""Nodes built after alias expansion; a "billion laughs" file hits this in milliseconds."""


@dataclass(frozen=True)
class Position:
    """1-based line and column of a node in the YAML text."""

    line: int
    column: int


@dataclass(frozen=True)
class YamlProblem(Exception):
    """A YAML-level problem at a position (syntax, duplicate key, bomb)."""

    message: str
    position: Position | None = None
    field: str = ""


@dataclass
class LoadedYaml:
    """The plain data of a YAML document and the position of every key (and value) path in it."""

    data: Any
    key_positions: dict[Loc, Position] = field(default_factory=dict)
    value_positions: dict[Loc, Position] = field(default_factory=dict)
    variables_used: dict[str, str] = field(default_factory=dict)
    """Each ``${VAR}`` replaced, with the value it got (for the spec hash and the report)."""

    def position_of(self, loc: Loc) -> Position | None:
        """Where the field at ``loc`` is, or its nearest existing parent (for missing keys)."""
        loc = tuple(loc)
        while loc:
            if loc in self.key_positions:
                return self.key_positions[loc]
            if loc in self.value_positions:
                return self.value_positions[loc]
            loc = loc[:-1]
        return self.value_positions.get(())


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader without the timestamp resolver: dates in a spec stay strings (``datetime: 2024-06-01``)."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


_VARIABLE = re.compile(r"\$(\$)?\{([^{}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def substitute(text: str, variables: Mapping[str, str], used: dict[str, str] | None = None) -> str:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in ``text``; ``$${...}`` stays literal (one ``$`` removed).

    Raises
    ------
    ValueError
        A variable that is not set and has no default, or a malformed reference; the message says what to do.
    """

    def one(match: re.Match[str]) -> str:
        if match.group(1):  # $${X}: escaped
            return "${" + match.group(2) + "}"
        body = match.group(2)
        name, sep, default = body.partition(":-")
        name = name.strip()
        if not _NAME.match(name):
            raise ValueError(f"${{{body}}} is not a variable reference; write ${{NAME}} or ${{NAME:-default}} "
                             f"(letters, digits, _), or $${{...}} for a literal")
        value = variables.get(name)
        if value is None or (value == "" and sep):
            if not sep:
                raise ValueError(f"variable {name} is not set; export it, pass --var {name}=VALUE, or give a "
                                 f"default: ${{{name}:-VALUE}}")
            value = default
        if "\n" in value or "\r" in value:
            raise ValueError(f"variable {name} holds a line break; a spec value is one line")
        if used is not None:
            used[name] = value
        return value

    return _VARIABLE.sub(one, text)


def _position(mark: Any) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)


class _Builder:
    def __init__(self, loader: _SpecLoader, result: LoadedYaml, variables: Mapping[str, str] | None = None):
        self.loader = loader
        self.result = result
        self.nodes_built = 0
        self.variables = variables

    def build(self, node: yaml.Node, loc: Loc) -> Any:
        self.nodes_built += 1
        if self.nodes_built > MAX_NODES:
            raise YamlProblem(
                f"the document expands to more than {MAX_NODES} values (an alias bomb?); a spec is a few dozen keys",
                _position(node.start_mark),
            )
        self.result.value_positions.setdefault(loc, _position(node.start_mark))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, loc)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(child, loc + (index,)) for index, child in enumerate(node.value)]
        if node.tag not in (
            "tag:yaml.org,2002:str",
            "tag:yaml.org,2002:int",
            "tag:yaml.org,2002:float",
            "tag:yaml.org,2002:bool",
            "tag:yaml.org,2002:null",
        ):
            raise YamlProblem(
                f"unsupported YAML tag {node.tag!r}; a spec holds only strings, numbers, booleans, lists and mappings",
                _position(node.start_mark),
                _dotted(loc),
            )
        if self.variables is not None and isinstance(node, yaml.ScalarNode) and "${" in node.value:
            return self._substituted(node, loc)
        return self.loader.construct_object(node, deep=True)

    def _substituted(self, node: yaml.ScalarNode, loc: Loc) -> Any:
        try:
            value = substitute(node.value, self.variables or {}, self.result.variables_used)
        except ValueError as err:
            raise YamlProblem(str(err), _position(node.start_mark), _dotted(loc)) from None
        if node.style is not None:  # quoted or block scalar: a string, whatever it now looks like
            return value
        tag = self.loader.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
        return self.loader.construct_object(yaml.ScalarNode(tag, value, node.start_mark, node.end_mark), deep=True)

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[str, Any]:
        if any(key.tag == "tag:yaml.org,2002:merge" for key, _ in node.value):
            self.loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlProblem("mapping keys must be plain strings", _position(key_node.start_mark), _dotted(loc))
            key = self.loader.construct_object(key_node)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise YamlProblem("mapping keys must be plain strings", _position(key_node.start_mark), _dotted(loc))
            if isinstance(key, bool) or key is None:
                # YAML 1.1 reads `on:`/`yes:`/`null:` as booleans or null; keep the text the user wrote.
                key = key_node.value
            if key in out:
                first = self.result.key_positions[loc + (key,)]
                raise YamlProblem(
                    f"duplicate key {key!r} (first at line {first.line}); YAML would silently keep only the last, "
                    f"so remove one of them",
                    _position(key_node.start_mark),
                    _dotted(loc + (key,)),
                )
            self.result.key_positions[loc + (key,)] = _position(key_node.start_mark)
            out[key] = self.build(value_node, loc + (key,))
        return out


def _field_at(text: str, line: int, column: int) -> str:
    """The dotted field whose value holds ``line:column``, found by parsing a copy with the bad characters
    replaced; empty when that copy does not parse either."""
    cleaned = "".join(c if c in "\t\n\r" or c >= " " else "\ufffd" for c in text)
    try:
        parsed = load_yaml_with_positions(cleaned)
    except YamlProblem:
        return ""
    before = [(pos.line, pos.column, loc) for loc, pos in parsed.value_positions.items()
              if loc and (pos.line, pos.column) <= (line, column)]
    return _dotted(max(before, key=lambda t: (t[0], t[1], len(t[2])))[2]) if before else ""


def load_yaml_with_positions(text: str, variables: Mapping[str, str] | None = None) -> LoadedYaml:
    """Parse one YAML document into plain data plus the position of every key.

    With ``variables`` (a mapping: the environment plus ``--var``), ``${VAR}`` references in values are replaced.

    Raises
    ------
    YamlProblem
        For syntax errors, tabs, duplicate keys, several documents, unsupported tags or alias bombs.
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise YamlProblem(f"the file is larger than {MAX_SPEC_BYTES // (1024 * 1024)} MB; a spec is a few kB")
    try:
        loader = _SpecLoader(text)
    except yaml.reader.ReaderError as err:
        # PyYAML checks the characters when the loader is made: a NUL byte, a control character
        before = text[: err.position]
        line, column = before.count("\n") + 1, err.position - (before.rfind("\n") + 1) + 1
        what = "a NUL byte" if err.character in (0, "\x00") else f"the control character {err.character!r}"
        raise YamlProblem(f"{what} is not allowed in a spec (a binary or corrupted file?); a spec is plain text",
                          Position(line, column), _field_at(text, line, column)) from None
    try:
        try:
            root = loader.get_single_node()
        except yaml.composer.ComposerError as err:
            if "expected a single document" in str(err):
                mark = err.problem_mark
                raise YamlProblem(
                    "the file holds more than one YAML document ('---'); put one spec per file",
                    _position(mark) if mark else None,
                ) from None
            raise
        except RecursionError:
            raise YamlProblem("the YAML nesting is too deep") from None
        result = LoadedYaml(data=None)
        if root is not None:
            try:
                result.data = _Builder(loader, result, variables).build(root, ())
            except RecursionError:
                raise YamlProblem("the YAML nests too deeply (a recursive alias?)") from None
        return result
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = err.problem or str(err)
        if "\t" in problem or "'\\t'" in problem:
            problem = "a tab character; YAML indents with spaces only, so replace the tab with spaces"
        elif err.context:
            problem = f"{problem} ({err.context})"
        raise YamlProblem(f"YAML syntax error: {problem}", _position(mark) if mark else None) from None
    except yaml.YAMLError as err:
        raise YamlProblem(f"YAML error: {err}") from None
    finally:
        loader.dispose()
