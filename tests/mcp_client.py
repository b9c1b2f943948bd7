"""A real MCP client (the official Python SDK) against svc's POST /mcp.

Usage: python3 tests/mcp_client.py URL TOKEN
Initializes, lists the tools, creates an issue with local_create_issue and queries it back with
local_query, then prints one JSON object with what it saw. Run by tests/server.rs.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


def text_of(result):
    return json.loads(result.content[0].text)


async def main(url: str, token: str) -> None:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                tools = await session.list_tools()
                created = await session.call_tool(
                    "local_create_issue", {"title": "Filed by the MCP client", "body": "From Python."}
                )
                issue = text_of(created)["issue"]
                query = await session.call_tool(
                    "local_query",
                    {"where": {"field": "title", "op": "contains", "value": "mcp client", "ci": True}, "select": ["id", "title", "state"]},
                )
                missing = await session.call_tool("local_read_issue", {})
                print(
                    json.dumps(
                        {
                            "protocolVersion": init.protocol_version,
                            "serverName": init.server_info.name,
                            "tools": [t.name for t in tools.tools],
                            "schemasAreObjects": all(t.input_schema.get("type") == "object" for t in tools.tools),
                            "created": issue,
                            "createdIsError": bool(created.is_error),
                            "query": text_of(query),
                            "missingIsError": bool(missing.is_error),
                            "missing": text_of(missing),
                        }
                    )
                )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
