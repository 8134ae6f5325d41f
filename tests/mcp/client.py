"""Drive Kiln's /mcp endpoint with the official MCP Python SDK (PyPI `mcp` 2.x).

Usage: python3 client.py URL API_KEY MODE
  MODE: "legacy" (the initialize handshake, Mcp-Session-Id) or "auto" (server/discover, the
  2026-07-28 per-request envelope, no handshake).

Prints one JSON object: what the SDK saw (tool results as the SDK parsed them, resource reads,
the negotiated version) and the HTTP requests it made (method header, session header), for
crates/kiln/tests/mcp.rs to assert on. Makes no assertions of its own.
"""

import asyncio
import base64
import json
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

PLOT = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [4, 1, 9])
plt.savefig("plot.png")
print("saved")
"""

CSV = """
with open("table.csv", "w") as f:
    f.write("a,b\\n1,2\\n3,4\\n")
print("wrote")
"""


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def main(url, key, mode):
    seen = []

    async def on_request(request):
        body = json.loads(request.content) if request.content else {}
        seen.append(
            {
                "http": request.method,
                "method": body.get("method"),
                "mcp_method": request.headers.get("mcp-method"),
                "session": request.headers.get("mcp-session-id"),
                "version": request.headers.get("mcp-protocol-version"),
            }
        )

    async def on_response(response):
        seen[-1]["status"] = response.status_code
        seen[-1]["session_answered"] = response.headers.get("mcp-session-id")

    http = httpx2.AsyncClient(
        headers={"X-API-Key": key},
        timeout=httpx2.Timeout(180.0),
        event_hooks={"request": [on_request], "response": [on_response]},
    )
    out = {}
    async with http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode) as c:
            out["protocol_version"] = c.protocol_version
            out["server_name"] = c.server_info.name if c.server_info else None
            out["tools"] = [dump(t) for t in (await c.list_tools()).tools]
            calls = {
                "py": ("execute_code", {"lang": "py", "code": "print(6 * 7)"}),
                "bash": ("execute_code", {"lang": "bash", "code": "echo hello from $0 | tr a-z A-Z"}),
                "failing": ("execute_code", {"lang": "py", "code": "import sys\nprint('before')\nsys.exit(3)"}),
                "plot": ("execute_code", {"lang": "py", "code": PLOT}),
                "csv": ("execute_code", {"lang": "py", "code": CSV}),
                "bad_lang": ("execute_code", {"lang": "cobol", "code": "x"}),
                "input_file": (
                    "execute_code",
                    {"lang": "py", "code": "print(open('in.txt').read().upper())",
                     "files": [{"name": "in.txt", "content": "uploaded"}]},
                ),
            }
            for name, (tool, args) in calls.items():
                out[name] = dump(await c.call_tool(tool, args))
            links = [b for b in out["csv"]["content"] if b["type"] == "resource_link"]
            if links:
                read = dump(await c.read_resource(links[0]["uri"]))
                out["csv_read"] = read
            try:
                await c.read_resource("kiln://files/AAAAAAAAAAAAAAAAAAAAA/BBBBBBBBBBBBBBBBBBBBB")
                out["missing_read"] = None
            except MCPError as e:
                out["missing_read"] = {"code": e.code, "message": str(e)}
            try:
                await c.call_tool("no_such_tool", {})
                out["unknown_tool"] = None
            except MCPError as e:
                out["unknown_tool"] = {"code": e.code}

            created = dump(await c.call_tool("create_session", {"lang": "py"}))
            out["create_session"] = created
            sid = created.get("structuredContent", {}).get("session_id")
            if sid:
                out["session_1"] = dump(await c.call_tool(
                    "execute_code", {"lang": "py", "code": "x = 40\nimport matplotlib.pyplot as plt", "session_id": sid}))
                out["session_2"] = dump(await c.call_tool(
                    "execute_code", {"lang": "py", "code": "print(x + 2)\nx + 1", "session_id": sid}))
                out["session_file"] = dump(await c.call_tool(
                    "execute_code",
                    {"lang": "py", "session_id": sid,
                     "code": "open('notes.txt', 'w').write('kernel file')"}))
                links = [b for b in out["session_file"]["content"] if b["type"] == "resource_link"]
                if links:
                    out["session_file_read"] = dump(await c.read_resource(links[0]["uri"]))
                out["close_session"] = dump(await c.call_tool("close_session", {"session_id": sid}))
                out["after_close"] = dump(await c.call_tool(
                    "execute_code", {"lang": "py", "code": "print(x)", "session_id": sid}))
    out["requests"] = seen
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
