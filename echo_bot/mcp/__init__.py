"""Tools from Model Context Protocol servers, each a tool like any other: a name, a risk,
a schema, a timeout, the approval gate, at-most-once execution.

``hub`` (no SDK import) runs every configured server and keeps their tools in the
registry; ``connection`` is the one module that imports the ``mcp`` SDK, and only when a
server is configured; ``naming`` turns a server's tool into ours (its name, its risk).
"""
