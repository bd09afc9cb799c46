"""The network edge: hypercorn set-up, auth, metrics and the WebSocket connection handlers."""
