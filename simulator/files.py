"""The one way the program reads a file from outside and writes a file or folder of its own.

Every file a command reads (scenario, grid, model config, node and GPU files, traces,
calibration CSVs, weights files, a run folder's files) goes through :func:`regular_file`:
it must be a regular file (a link to ``/dev/zero`` or a FIFO is refused before a byte is
read) no larger than its kind's cap, and TOML or JSON no deeper than :data:`MAX_DEPTH`.
Errors name the file and what is allowed, and show at most :data:`EXCERPT` characters of a
value (:func:`excerpt`): a file pointed at ``/proc/self/environ`` must not reach a
terminal or a sweep CSV.

Every file or folder a command writes goes through :func:`out_folder` or :func:`out_file`:
a target that is a symbolic link is refused (nothing is written through it), a file where a
folder belongs (or the reverse) is refused, missing parents are created, and every refusal
is a :class:`~simulator.errors.ScenarioError` (exit 2) raised before anything is written.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

from simulator.errors import ScenarioError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Longest excerpt of a value an error shows (characters).
EXCERPT = 24
#: Deepest nesting of tables or arrays a TOML or JSON input may have.
MAX_DEPTH = 32
#: Size caps (bytes) per kind of input: settings files are small; traces may be long.
MAX_CONFIG_BYTES = 16 * 2**20  # scenario, grid, node, GPU, model config, weights file
MAX_DATA_BYTES = 4 * 2**30  # traces, calibration tables, a run folder's tables


def excerpt(value: object, limit: int = EXCERPT) -> str:
    """``value`` as a short printable excerpt: non-printable characters become ``?`` and the
    text is cut to ``limit`` characters (``...`` marks the cut)."""
    text = re.sub(r"[^\x20-\x7e]", "?", str(value))
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def regular_file(path: str | Path, key: str, limit: int = MAX_CONFIG_BYTES) -> Path:
    """``path`` if it names a regular file of at most ``limit`` bytes (links followed to
    one); else a :class:`ScenarioError` naming ``key`` and the path."""
    path = Path(path)
    where = f"{key}: {str(path)!r}"
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ScenarioError(f"{where} not found") from None
    except OSError as exc:
        raise ScenarioError(f"{where} cannot be read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ScenarioError(f"{where} is not a file (it is a folder)")
    if not stat.S_ISREG(st.st_mode):
        raise ScenarioError(f"{where} is not a regular file (a device, pipe or socket; "
                            f"give a file)")
    if st.st_size > limit:
        raise ScenarioError(f"{where} is {st.st_size} bytes, above the {limit} a "
                            f"{'settings' if limit <= MAX_CONFIG_BYTES else 'data'} file "
                            f"may have")
    return path


def read_bytes(path: str | Path, key: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (see :func:`regular_file`)."""
    path = regular_file(path, key, limit)
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise ScenarioError(f"{key}: {str(path)!r} cannot be read ({exc.strerror})") from None
    if len(data) > limit:  # grew since the check
        raise ScenarioError(f"{key}: {str(path)!r} is above the {limit} bytes it may have")
    return data


def read_text(path: str | Path, key: str, limit: int = MAX_CONFIG_BYTES) -> str:
    """A regular file's UTF-8 text (a byte-order mark dropped)."""
    data = read_bytes(path, key, limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{key}: {str(path)!r} is not UTF-8 text (byte {exc.start})"
                            ) from None


def check_depth(value: object, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse tables or arrays nested deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                raise ScenarioError(f"{where}: nests tables or arrays deeper than {limit} "
                                    f"levels")
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict)
                                                  else node))


def parse_toml(text: str, where: str) -> dict:
    """TOML text as a dict; bad TOML or nesting deeper than :data:`MAX_DEPTH` is an error
    naming ``where``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ScenarioError(f"{where}: nests tables or arrays deeper than {MAX_DEPTH} "
                            f"levels") from None
    check_depth(data, where)
    return data


def parse_json(text: str | bytes, where: str) -> object:
    """JSON text as Python values; bad JSON or nesting deeper than :data:`MAX_DEPTH` is an
    error naming ``where``."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ScenarioError(f"{where}: nests objects or arrays deeper than {MAX_DEPTH} "
                            f"levels") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise ScenarioError(f"{where}: not valid JSON ({msg})") from None
    check_depth(data, where)
    return data


def load_toml(path: str | Path, key: str) -> dict:
    """A TOML file of at most :data:`MAX_CONFIG_BYTES`, checked as :func:`parse_toml`."""
    return parse_toml(read_text(path, key), f"{key}: {str(path)!r}")


def load_json(path: str | Path, key: str) -> object:
    """A JSON file of at most :data:`MAX_CONFIG_BYTES`, checked as :func:`parse_json`."""
    return parse_json(read_text(path, key), f"{key}: {str(path)!r}")


# -- writing --------------------------------------------------------------------------------

def _parents(path: Path, where: str) -> None:
    """Create the missing parents of ``path``, or refuse naming the one in the way."""
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ScenarioError(f"{where}: a parent of it is a file, not a folder") from None
    except NotADirectoryError:
        raise ScenarioError(f"{where}: a parent of it is a file, not a folder") from None
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot create its folder ({exc.strerror})") from None


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def out_folder(path: str | Path, flag: str, create: bool = True) -> Path:
    """A folder a command writes files into, created with its parents (unless ``create``
    is false: then only checked, before a long computation); a symbolic link or an
    existing file at ``path`` is refused (``flag`` names the option)."""
    path = Path(path)
    where = f"{flag} {str(path)!r}"
    if path.is_symlink():
        raise ScenarioError(f"{where}: is a symbolic link; give the real folder")
    if path.exists() and not path.is_dir():
        raise ScenarioError(f"{where}: exists and is not a folder")
    if not create:
        parent = nearest_existing(path)
        if not parent.is_dir():
            raise ScenarioError(f"{where}: {str(parent)!r} is not a folder")
        return path
    _parents(path, where)
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot create it ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ScenarioError(f"{where}: cannot write in it (permission denied)")
    return path


def out_file(path: str | Path, flag: str) -> Path:
    """A file a command writes (new or replaced), its parents created; a symbolic link or
    a folder at ``path`` is refused, so nothing outside is written through a link."""
    path = Path(path)
    where = f"{flag} {str(path)!r}"
    if path.is_symlink():
        raise ScenarioError(f"{where}: is a symbolic link; refusing to write through it")
    if path.is_dir():
        raise ScenarioError(f"{where}: is a folder; give a file name")
    if path.exists() and not path.is_file():
        raise ScenarioError(f"{where}: is not a regular file")
    _parents(path, where)
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ScenarioError(f"{where}: cannot write in {str(path.parent)!r} "
                            f"(permission denied)")
    return path


def out_files(folder: str | Path, names: list[str], flag: str) -> list[Path]:
    """The paths ``folder/name`` a command is about to write, every one checked (the
    folder by :func:`out_folder`, each file by :func:`out_file`) before any is written: a
    refusal leaves the folder as it was."""
    folder = out_folder(folder, flag)
    return [out_file(folder / name, flag) for name in names]
