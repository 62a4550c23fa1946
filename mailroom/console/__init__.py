"""The operators' console: web pages to review documents and act on what needs a person.

Server-rendered (Starlette and Jinja2), one more process (``mailroom console``). It reads
and writes only through the core functions the CLI uses, so the two cannot disagree.
"""
