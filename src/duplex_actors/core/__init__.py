"""The engine core and its front ends: one process owns the model, the slot table, admission,
the tick policy and the batching; front-end processes (connections, dialects, session actors,
session logs) reach it through :mod:`.link` over a Unix socket, with audio in shared memory
(:mod:`.rings`) and control in small messages (:mod:`.wire`). docs/design.md, decision 14."""
