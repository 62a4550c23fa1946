"""Settings read from files: ``MAILROOM_…_FILE`` variables and a secrets directory.

Docker and Kubernetes hand secrets over as files. Any variable may be given as a
file instead: ``MAILROOM_DATABASE__URL_FILE=/run/secrets/db-url`` reads
``MAILROOM_DATABASE__URL`` from that file, and a file named like the variable
(``MAILROOM_DATABASE__URL``) in the folder ``MAILROOM_SECRETS_DIR`` does the same.
The text then goes through the same strict checks as a variable, so nested keys and
JSON values (mailboxes, webhook accounts) work alike. One trailing newline is dropped.

Order: a variable beats its ``_FILE`` variable beats the secrets directory; a variable
and its ``_FILE`` variable both set is an error. A setting whose own name ends in
``_file`` (a CA file) keeps that meaning. The files' text is never echoed in errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from mailroom.errors import SecretFileError

#: Suffix of a variable that names the file holding another variable's value.
FILE_SUFFIX = "_FILE"
#: The variable naming the secrets directory (files named like the variables they set).
SECRETS_DIR_VARIABLE = "MAILROOM_SECRETS_DIR"
PREFIX = "MAILROOM_"


def with_secret_files(
    env: Mapping[str, str | None], is_setting: Callable[[str], bool], *, case_sensitive: bool
) -> dict[str, str | None]:
    """``env`` with each ``…_FILE`` variable replaced by its file's text, and the directory's files.

    ``is_setting`` tells whether an upper-case ``MAILROOM_*`` name names a setting.
    Names keep the case convention of ``env`` (lower-case unless ``case_sensitive``).
    """
    result = dict(env)
    for name, path in env.items():
        upper = name.upper()
        if path is None or not upper.startswith(PREFIX) or not upper.endswith(FILE_SUFFIX):
            continue
        target = name[: -len(FILE_SUFFIX)]
        if is_setting(upper) or not is_setting(target.upper()):
            continue  # a setting of its own (ca_file), or unknown: the strict check reports it
        if target in env:
            raise SecretFileError(f"{target.upper()} and {upper} are both set: keep one")
        del result[name]
        result[target] = read_secret(upper, Path(path))
    directory = next((v for k, v in env.items() if k.upper() == SECRETS_DIR_VARIABLE), None)
    if directory:
        for upper, file in _directory_files(Path(directory)):
            key = upper if case_sensitive else upper.lower()
            if key not in result:
                result[key] = read_secret(f"{SECRETS_DIR_VARIABLE} file {file.name}", file)
    return result


def read_secret(source: str, path: Path) -> str:
    """The text of a secret file, one trailing newline dropped; one clear line when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SecretFileError(f"{source}: no file {str(path)!r}") from None
    except OSError as exc:
        raise SecretFileError(f"{source}: cannot read {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SecretFileError(f"{source}: {str(path)!r} is not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r")


def _directory_files(directory: Path) -> list[tuple[str, Path]]:
    """The ``MAILROOM_*`` files of the secrets directory, by upper-case name.

    Other names are ignored: a mounted Kubernetes secret also holds ``..data`` links
    and keys meant for other programs.
    """
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SecretFileError(
            f"{SECRETS_DIR_VARIABLE}: cannot list {str(directory)!r}: {reason}"
        ) from None
    return [
        (entry.name.upper(), entry)
        for entry in entries
        if entry.name.upper().startswith(PREFIX) and entry.is_file()
    ]
