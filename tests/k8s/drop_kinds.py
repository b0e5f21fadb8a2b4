"""Filter a multi-document YAML stream (stdin -> stdout), dropping documents of the given kinds.

    helm template ... | python3 tests/k8s/drop_kinds.py ServiceMonitor PrometheusRule | kubectl ...

Plain text splitting on document separators (no YAML library: runs on the system Python).
"""

import re
import sys

kinds = set(sys.argv[1:])
docs = re.split(r"^---\s*$", sys.stdin.read(), flags=re.M)
kept = []
for doc in docs:
    m = re.search(r"^kind:\s*(\S+)", doc, flags=re.M)
    if m and m.group(1) in kinds:
        continue
    if doc.strip():
        kept.append(doc)
sys.stdout.write("\n---".join(kept))
