"""scripts/openapi_extract.py: the extract keeps the schemas the client needs and drops prose."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).parents[2] / "scripts" / "openapi_extract.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("openapi_extract", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _document(extract: Any) -> dict[str, Any]:
    ok = {
        "200": {
            "description": "OK",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/thing"}}},
        }
    }
    paths: dict[str, Any] = {
        p: {m: {"summary": "prose", "x-codeSamples": [], "responses": ok} for m in methods}
        for p, methods in extract.OPERATIONS.items()
    }
    paths["/unused"] = {"get": {"responses": {"200": {"description": "OK"}}}}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Vultr API", "version": "2.0", "description": "long prose"},
        "paths": paths,
        "components": {
            "schemas": {
                "thing": {
                    "title": "thing",
                    "description": "prose",
                    "properties": {
                        "description": {
                            "type": "string",
                            "description": "a field named description",
                        },
                        "meta": {"$ref": "#/components/schemas/meta"},
                    },
                },
                "meta": {"type": "object", "example": {"total": 1}},
                "unused": {"type": "string"},
            }
        },
    }


def test_extract_keeps_used_routes_and_referenced_schemas_without_prose(tmp_path: Path) -> None:
    mod = _module()
    doc_path = tmp_path / "openapi-v2-2024-01-31.json"
    doc_path.write_text(json.dumps(_document(mod)))
    out = tmp_path / "extract.json"
    assert mod.main([str(doc_path), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["x-extract"]["date"] == "2024-01-31" and got["x-extract"]["version"] == "2.0"
    assert set(got["paths"]) == set(mod.OPERATIONS)
    assert set(got["components"]["schemas"]) == {"thing", "meta"}
    thing = got["components"]["schemas"]["thing"]
    assert thing == {
        "title": "thing",
        "properties": {
            "description": {"type": "string"},
            "meta": {"$ref": "#/components/schemas/meta"},
        },
    }
    assert got["components"]["schemas"]["meta"] == {"type": "object"}
    assert "summary" not in got["paths"]["/account"]["get"]


def test_extract_refuses_a_document_without_a_date(tmp_path: Path, capsys: Any) -> None:
    mod = _module()
    doc_path = tmp_path / "openapi.json"
    doc_path.write_text(json.dumps(_document(mod)))
    assert mod.main([str(doc_path), "--out", str(tmp_path / "x.json")]) == 2
    assert "--date YYYY-MM-DD" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
