"""The images' health check: ready when ACCSCALE_HEALTH_URL (a KServe v2 /v2/health/ready) answers 200.

The images carry no curl; this is the standard library only, and it ignores any proxy from the environment.
"""

import os
import sys
import urllib.request

url = os.environ.get("ACCSCALE_HEALTH_URL", "http://127.0.0.1:8100/v2/health/ready")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(url, timeout=2) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError as exc:
    print(f"{url}: {exc}", file=sys.stderr)
    sys.exit(1)
