"""A scripted MCP stdio server for ctxmcp's protocol tests.

Options:
  --version V     protocolVersion to answer initialize with ("none": leave it out)
  --tools N       offer tools t0..t{N-1} (plus echo, fail, structured, "has space")
  --page K        K tools per tools/list page (nextCursor pagination)
  --record FILE   append every line received to FILE
  --batch         answer tools/list and tools/call inside a JSON-RPC batch
  --garbage       answer initialize with a line that is not JSON-RPC
  --die           exit 3 on initialize
  --hang          never answer tools/call
  --ping          send a ping and wait for its answer before answering tools/call
  --stubborn      ignore SIGTERM and stdin EOF (to be killed)
  --pidfile FILE  write the pid to FILE

A batch received under any version but 2025-03-26 makes it exit 4.
"""

import json
import signal
import sys
import time

args = sys.argv[1:]


def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default


version = opt("--version", "2025-11-25")
ntools = int(opt("--tools", "0"))
page = int(opt("--page", "1000"))
record = opt("--record")
if opt("--pidfile"):
    with open(opt("--pidfile"), "w") as f:
        f.write(str(__import__("os").getpid()))
if "--stubborn" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

sys.stderr.write("scripted server: started\n")
sys.stderr.flush()


def send(msg, batch=False):
    sys.stdout.write(json.dumps([msg] if batch else msg) + "\n")
    sys.stdout.flush()


def tool(name):
    return {"name": name, "description": "Tool " + name + ".\nSecond line.",
            "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}


tools = [tool("t%d" % i) for i in range(ntools)]
tools += [tool("echo"), tool("fail"), tool("structured"), tool("has space")]


def call(params):
    name, arguments = params.get("name"), params.get("arguments")
    if name == "fail":
        return {"content": [{"type": "text", "text": "it failed on purpose"}], "isError": True}
    if name == "structured":
        return {"content": [{"type": "text", "text": json.dumps(arguments)}], "structuredContent": {"got": arguments}}
    return {"content": [{"type": "text", "text": json.dumps(arguments, sort_keys=True)}]}


for line in sys.stdin:
    if record:
        with open(record, "a") as f:
            f.write(line)
    msg = json.loads(line)
    if isinstance(msg, list):
        sys.stderr.write("scripted server: got a batch\n")
        if version != "2025-03-26":
            sys.exit(4)
        continue
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        if "--die" in args:
            sys.exit(3)
        if "--garbage" in args:
            print("Server ready!", flush=True)
            continue
        result = {"capabilities": {"tools": {}}, "serverInfo": {"name": "scripted", "version": "1"}}
        if version != "none":
            result["protocolVersion"] = version
        send({"jsonrpc": "2.0", "id": mid, "result": result})
    elif method == "tools/list":
        start = int(msg.get("params", {}).get("cursor", "0"))
        result = {"tools": tools[start:start + page]}
        if start + page < len(tools):
            result["nextCursor"] = str(start + page)
        send({"jsonrpc": "2.0", "id": mid, "result": result}, "--batch" in args)
    elif method == "tools/call":
        if "--hang" in args:
            continue
        if "--ping" in args:
            send({"jsonrpc": "2.0", "id": "ping-1", "method": "ping"})
            answer = json.loads(sys.stdin.readline())
            if record:
                with open(record, "a") as f:
                    f.write(json.dumps(answer) + "\n")
            if answer != {"jsonrpc": "2.0", "id": "ping-1", "result": {}}:
                sys.exit(5)
        send({"jsonrpc": "2.0", "id": mid, "result": call(msg.get("params", {}))}, "--batch" in args)
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no " + str(method)}})

if "--stubborn" in args:
    while True:
        time.sleep(1)
