"""A launch script read the way bash would expand its launch line, without running it.

Real Megatron-LM scripts build the line from variables (``GPT_ARGS="--num-layers 24 ..."``,
``DISTRIBUTED_ARGS=(--nproc_per_node 8 ...)``, ``${NNODES:-1}``, ``$(($GPUS * $NODES))``) and
start with ``export`` lines. The reader keeps, in order:

    assignment  NAME=value, export NAME=value, declare/local NAME=value, NAME=( words ) (an
                array), the value expanded with the variables assigned so far
    launch      the first command that runs a Python training script (``*.py``): its words,
                with line continuations joined, ``$NAME``, ``${NAME}``, ``${NAME:-default}``,
                ``${NAME[@]}`` and integer ``$(( ... ))`` expanded as bash expands them

A variable the script reads from its environment (``$SLURM_NNODES``) expands to a marker that
names it, so a flag whose value needs it is refused with "set NAME" (``unset_variable``); a
command substitution ``$( ... )`` cannot be expanded without running it and is refused too. A text
without a launch command is returned as it is (an argument file).
"""

from __future__ import annotations

import ast
import operator
import re
import shlex

from planner.errors import SettingsError

UNSET = "__unset_variable_{}__"
_UNSET_RE = re.compile(r"__unset_variable_([A-Za-z_][A-Za-z0-9_]*)__")
_ASSIGN = re.compile(r"^(?:export\s+|declare\s+(?:-\w+\s+)*|local\s+)?([A-Za-z_]\w*)=(.*)$", re.S)
_VAR = re.compile(
    r"\$\(\((?P<arith>.*?)\)\)|\$\((?P<command>[^)]*)\)|\$\{(?P<braced>[^}]*)\}|\$(?P<plain>[A-Za-z_]\w*)"
)
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # bash arithmetic is integer
    ast.Mod: operator.mod,
}


def unset_variable(text: str) -> str | None:
    """The name of the environment variable whose marker ``text`` holds, or None."""
    found = _UNSET_RE.search(text)
    return found.group(1) if found else None


def launch_text(text: str) -> str:
    """The launch command of a script with its variables expanded (see the module text), or
    ``text`` itself when no command runs a ``.py`` script."""
    env: dict[str, str | list[str]] = {}
    for line in _logical_lines(text):
        assigned = _ASSIGN.match(line)
        if assigned and ".py" not in assigned.group(1):
            name, raw = assigned.groups()
            env[name] = _value(raw.strip(), env)
        elif re.search(r"\S+\.py\b", line):
            return _expand(line, env)
    return text


def without_comments(text: str) -> str:
    """``text`` with bash's comments removed: ``#`` at the start of a word, outside quotes (a
    ``#`` inside a word, ``a#b``, is kept, as bash keeps it; Python's shlex would cut there)."""
    out, quote = [], ""
    for line in text.splitlines():
        kept, quote = _without_comment(line, quote)
        out.append(kept)
    return "\n".join(out)


def _logical_lines(text: str) -> list[str]:
    """Lines with comments dropped (``#`` at a word's start outside quotes, as bash reads it),
    backslash continuations joined, and a quoted string or an array assignment spanning lines
    joined up to its end."""
    lines, current, quote = [], "", ""
    for raw in text.splitlines():
        stripped, quote = _without_comment(raw, quote)
        stripped = stripped.strip()
        if not current and not stripped:
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        depth = current.count("(") - current.count(")")
        array = depth > 0 and re.match(r"^(?:export\s+|declare\s+\S+\s+)?\w+=\(", current)
        if array or quote:
            current += " "
            continue
        lines.append(current)
        current = ""
    return lines + ([current] if current else [])


def _without_comment(line: str, quote: str) -> tuple[str, str]:
    """``line`` up to a comment, and the quote still open at its end (``quote``: open at its
    start)."""
    for k, char in enumerate(line):
        if quote:
            quote = "" if char == quote and (quote == "'" or line[k - 1 : k] != "\\") else quote
        elif char in "'\"" and line[k - 1 : k] != "\\":
            quote = char
        elif char == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k], quote
    return line, quote


def _value(raw: str, env: dict) -> str | list[str]:
    """An assignment's value: an array's words, or one word (quotes removed, expanded)."""
    if raw.startswith("(") and raw.endswith(")"):
        return shlex.split(_expand(raw[1:-1], env), comments=True)
    words = shlex.split(_expand(raw, env, quoted=raw.startswith("'")) or "''", comments=True)
    return " ".join(words)


def _expand(text: str, env: dict, quoted: bool = False) -> str:
    """``text`` with its variables expanded (none inside single quotes)."""
    if quoted:
        return text
    # "${ARRAY[@]}" is the array's words, not one word
    text = re.sub(r'"(\$\{\w+\[[@*]\]\})"', r"\1", text)
    return _VAR.sub(lambda m: _substitute(m, env), text)


def _substitute(match: re.Match, env: dict) -> str:
    if match.group("command") is not None:
        raise SettingsError(
            f"--from-megatron: the launch line runs a command, $({match.group('command')}): "
            "expand it by hand (the planner does not run the script)"
        )
    if match.group("arith") is not None:
        return _arithmetic(_expand(match.group("arith"), env), env)
    body = match.group("braced") if match.group("plain") is None else match.group("plain")
    parts = re.fullmatch(r"([A-Za-z_]\w*)(?:\[[@*]\])?(?::?-(.*))?", body, re.S)
    if parts is None:
        raise SettingsError(f"--from-megatron: cannot expand ${{{body}}} without running bash")
    name, default = parts.groups()
    value = env.get(name)
    if value is None:
        return _expand(default, env) if default is not None else UNSET.format(name)
    return " ".join(shlex.quote(w) for w in value) if isinstance(value, list) else value


def _arithmetic(text: str, env: dict) -> str:
    """Integer arithmetic of bash's ``$(( ))``: numbers, variables, + - * / % and parentheses.
    An unset variable spreads to the result (refused only where the result is read)."""
    missing = unset_variable(text)
    if missing:
        return UNSET.format(missing)
    names = re.findall(r"\b([A-Za-z_]\w*)\b", text)
    for name in names:
        value = env.get(name)
        if value is None or unset_variable(str(value)):
            return UNSET.format(unset_variable(str(value)) if value else name)
    text = re.sub(r"\b([A-Za-z_]\w*)\b", lambda m: str(env[m.group(1)]), text)
    try:
        return str(_evaluate(ast.parse(text.strip(), mode="eval").body))
    except (SyntaxError, ValueError, KeyError, ZeroDivisionError):
        raise SettingsError(
            f"--from-megatron: cannot evaluate $(( {text.strip()} )) (a variable the script "
            "does not set?)"
        ) from None


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not integer arithmetic")
