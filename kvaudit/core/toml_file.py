"""Reading a user's TOML file (a gate policy, an engines file): every failure a :class:`KvauditError`
naming the file, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvaudit.core.errors import KvauditError, cut


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """``path`` parsed as TOML; ``what`` names the file's kind in messages ("policy file")."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise KvauditError(f"reading a {what} needs Python 3.11+ or the 'tomli' package") from None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvauditError(f"{path}: {what} not found") from None
    except OSError as e:  # a directory, unreadable, ...
        raise KvauditError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise KvauditError(f"{path}: not valid TOML ({cut(e, 200)})") from None
    except RecursionError:
        raise KvauditError(f"{path}: not valid TOML (nested too deeply)") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise KvauditError(f"{path}: not valid TOML ({cut(e, 120)})") from None
