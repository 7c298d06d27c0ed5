"""Writes the fixture JSON files: objects indented, lists of numbers on one line."""

import json
import sys


def write_json(path, value):
    """JSON with objects indented and every list of numbers or pairs on one line."""
    with open(path, "w", encoding="utf-8") as out:
        out.write(to_json(value, 0))
        out.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def to_json(value, depth):
    indent = "  " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{indent}{json.dumps(key)}: {to_json(item, depth + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * depth + "}"
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        items = [indent + to_json(item, depth + 1) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * depth + "]"
    if isinstance(value, list) and any(isinstance(item, list) and len(item) > 2 for item in value):
        items = [indent + json.dumps(item, ensure_ascii=False) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * depth + "]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
