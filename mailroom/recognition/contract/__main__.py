"""``python -m mailroom.recognition.contract --write``: regenerate the files under ``contracts/``
and the rules of "Writing a recognition service".

Apart from the models, so that importing them (the service kit does) brings nothing else.
"""

from __future__ import annotations

import sys

from mailroom.recognition.contract.asyncapi import write_asyncapi
from mailroom.recognition.contract.models import CONTRACTS_DIR, write_schemas
from mailroom.recognition.contract.rules import write_docs

if "--write" in sys.argv:
    for path in [*write_schemas(), write_asyncapi(), write_docs()]:
        print(path.relative_to(CONTRACTS_DIR.parent))
