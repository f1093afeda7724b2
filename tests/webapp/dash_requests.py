"""Callback requests as the browser sends them, built from the app's `_dash-dependencies`,
so tests can send values no page would (crafted input) over real HTTP."""

from __future__ import annotations

import http.client
import json


def request(server, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one raw HTTP request to the server."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request(method, path, body=body,
                 headers={"Host": f"127.0.0.1:{server.port}", **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


_DEPENDENCIES: dict[int, list[dict]] = {}


def dependencies(server, headers: dict | None = None) -> list[dict]:
    """The app's callbacks (fetched once per server port)."""
    if server.port not in _DEPENDENCIES:
        status, _, body = request(server, "GET", "/_dash-dependencies", headers=headers)
        assert status == 200
        _DEPENDENCIES[server.port] = json.loads(body)
    return _DEPENDENCIES[server.port]


def call(server, output: str, values: dict, changed: str,
         headers: dict | None = None) -> tuple[int, bytes]:
    """Sends the callback whose output names `output`, with inputs and states from `values`
    ("component.property" -> value; pattern-matching inputs get [])."""
    spec = next(d for d in dependencies(server, headers) if output in d["output"])

    def items(kind):
        out = []
        for item in spec[kind]:
            if item["id"].startswith("{"):
                out.append([])
                continue
            key = f"{item['id']}.{item['property']}"
            out.append({"id": item["id"], "property": item["property"], "value": values.get(key)})
        return out

    outputs = [{"id": o.split(".")[0], "property": o.split(".")[1]}
               for o in spec["output"].strip(".").split("...")]
    body = json.dumps({"output": spec["output"],
                       "outputs": outputs if len(outputs) > 1 else outputs[0],
                       "inputs": items("inputs"), "state": items("state"),
                       "changedPropIds": [changed]}).encode()
    status, _, data = request(server, "POST", "/_dash-update-component", body,
                              {"Content-Type": "application/json", **(headers or {})})
    return status, data
