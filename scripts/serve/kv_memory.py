"""Peak resident memory of `lm-cli serve` holding N long sequences at once.

Starts `lm-cli serve --parallel N --kv-type TYPE --cache-mb 0` (prefix cache
off, so only live sequences hold KV) on a free loopback port, sends N
distinct ~1,440-word prompts to /v1/completions at once (max_tokens 60,
temperature 0), and prints the server's idle RSS and peak RSS (VmHWM) in
MB. docs/performance.md ("An 8-bit KV cache") compares 16 f16 sequences
with 32 q8_0 ones.

    python3 scripts/serve/kv_memory.py target/release/lm-cli MODEL.gguf 32 q8_0 [EXTRA SERVE FLAGS]
"""

import json
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request

WORDS = "the a river stone light house garden winter morning silver quiet road old green".split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_mb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    binary, model, n, kv, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
    port = free_port()
    cmd = [binary, "serve", "--model", model, "--threads", "2", "--cache-mb", "0", "--any-model",
           "--parallel", str(n), "--kv-type", kv, "--port", str(port), *extra]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit(f"the server exited with {server.returncode}")
                time.sleep(0.1)
        idle = status_mb(server.pid, "VmRSS")
        lengths = {}

        def ask(i):
            rng = random.Random(i)
            prompt = f"Story {i}: " + " ".join(rng.choice(WORDS) for _ in range(1440))
            body = json.dumps({"prompt": prompt, "max_tokens": 60, "temperature": 0}).encode()
            request = urllib.request.Request(base + "/v1/completions", body,
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=3600) as reply:
                lengths[i] = json.load(reply)["usage"]["total_tokens"]

        started = time.time()
        clients = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        if len(lengths) != n:
            sys.exit(f"{n - len(lengths)} of {n} requests failed")
        peak = status_mb(server.pid, "VmHWM")
        print(f"--kv-type {kv}, {n} sequences {' '.join(extra)}: idle RSS {idle:.0f} MB, "
              f"peak RSS {peak:.0f} MB, tokens per sequence {min(lengths.values())}-"
              f"{max(lengths.values())}, {time.time() - started:.0f} s")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
