"""``python -m mailroom.recognition.contract --write``: regenerate the files under ``contracts/``.

Apart from the models, so that importing them (the service kit does) brings nothing else.
"""

from __future__ import annotations

import sys

from mailroom.recognition.contract.asyncapi import write_asyncapi
from mailroom.recognition.contract.models import CONTRACTS_DIR, write_schemas

if "--write" in sys.argv:
    for path in [*write_schemas(), write_asyncapi()]:
        print(path.relative_to(CONTRACTS_DIR.parent))
