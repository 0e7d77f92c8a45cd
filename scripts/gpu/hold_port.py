"""Hold a TCP port on 127.0.0.1 and 0.0.0.0 for SECONDS (helper for the EADDRINUSE scenarios)."""

from __future__ import annotations

import socket
import sys
import time

port, secs = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket()
s.bind(("0.0.0.0", port))
s.listen()
print(f"holding port {port}", flush=True)
time.sleep(secs)
