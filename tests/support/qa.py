"""QA files for tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_qa(path: Path, questions: int) -> Path:
    lines = [
        json.dumps({"id": f"q{i}", "question": f"question {i}?", "answers": [f"a{i}"]})
        for i in range(questions)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path
