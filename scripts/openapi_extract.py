#!/usr/bin/env python3
"""Regenerate the trimmed extract of Vultr's OpenAPI document that the contract tests read.

Keeps only the operations the client calls (their parameters, request and response schemas and
security) and the components they reference, without prose (descriptions, summaries, examples,
code samples, tags, x- extensions). Records the document's title, version and date and the
SHA-256 of the full document under ``x-extract``, so the extract says what it was cut from.

Example: scripts/openapi_extract.py ~/Downloads/openapi-v2-2023-12-07.json
(the date comes from the file name, or give it with --date YYYY-MM-DD). Standard library only:
any python3 runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "tests" / "openapi" / "vultr-v2-extract.json"

# Every operation vultrscale.vultr.client calls, and the invoice items whose shape
# /billing/pending-charges (newer than the 2023 document) follows.
OPERATIONS = {
    "/instances": ("get", "post"),
    "/instances/{instance-id}": ("get", "delete"),
    "/instances/{instance-id}/user-data": ("get",),
    "/snapshots": ("get", "post"),
    "/snapshots/{snapshot-id}": ("get", "delete"),
    "/plans": ("get",),
    "/regions": ("get",),
    "/regions/{region-id}/availability": ("get",),
    "/account": ("get",),
    "/billing/invoices/{invoice-id}/items": ("get",),
}
PROSE = {"description", "summary", "example", "examples", "externalDocs", "tags"}
# maps whose keys are names (a property called "description" is not prose)
NAMED_MAPS = {"properties", "responses", "content", "schemas"}


def _strip(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in PROSE or key.startswith("x-"):
            continue
        if key in NAMED_MAPS and isinstance(value, dict):
            out[key] = {name: _strip(v) for name, v in value.items()}
        else:
            out[key] = _strip(value)
    return out


def _refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(_refs(n) for n in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
    return found.union(*(_refs(v) for v in node.values()))


def _lookup(doc: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        raise SystemExit(f"openapi_extract: only local $refs are supported, found {ref!r}")
    target: Any = doc
    for part in ref[2:].split("/"):
        target = target[part]
    return target


def extract(doc: dict[str, Any], source: bytes, name: str, date: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path, methods in OPERATIONS.items():
        item = doc["paths"].get(path)
        missing = [m for m in methods if not item or m not in item]
        if missing:
            raise SystemExit(f"openapi_extract: {path} has no {', '.join(missing)} in {name}")
        kept = {m: _strip(item[m]) for m in methods}
        if "parameters" in item:
            kept["parameters"] = _strip(item["parameters"])
        paths[path] = kept
    components: dict[str, dict[str, Any]] = {}
    todo = sorted(_refs(paths))
    while todo:
        ref = todo.pop()
        top, section, key = ref[2:].split("/", 2)
        if top != "components":
            raise SystemExit(f"openapi_extract: a $ref outside components: {ref!r}")
        if key in components.get(section, {}):
            continue
        node = _strip(_lookup(doc, ref))
        components.setdefault(section, {})[key] = node
        todo.extend(sorted(_refs(node)))
    info = doc.get("info", {})
    return {
        "openapi": doc["openapi"],
        "info": {"title": info.get("title", ""), "version": info.get("version", "")},
        "x-extract": {
            "source": name,
            "version": info.get("version", ""),
            "date": date,
            "sha256": hashlib.sha256(source).hexdigest(),
            "made_by": "scripts/openapi_extract.py",
        },
        "paths": paths,
        "components": {s: dict(sorted(v.items())) for s, v in sorted(components.items())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: scripts/openapi_extract.py openapi-v2-2023-12-07.json",
    )
    parser.add_argument("document", type=Path, help="the full OpenAPI document (JSON)")
    parser.add_argument("--date", help="the document's date, YYYY-MM-DD (default: from its name)")
    parser.add_argument(
        "--out", type=Path, default=OUT, help="where to write (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        source = args.document.read_bytes()
        doc = json.loads(source)
    except (OSError, ValueError) as exc:
        print(f"openapi_extract: cannot read {args.document}: {exc}", file=sys.stderr)
        return 2
    found = re.search(r"\d{4}-\d{2}-\d{2}", args.document.name)
    date = args.date or (found.group(0) if found else "")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        print(
            "openapi_extract: the document's date is not in its file name. "
            "Fix: give it with --date YYYY-MM-DD.",
            file=sys.stderr,
        )
        return 2
    out = extract(doc, source, args.document.name, date)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(out['paths'])} paths)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
