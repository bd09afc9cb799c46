"""Scale-out past one GPU: many ``duplex-actors serve`` processes behind HAProxy.

- :mod:`.agent`: the HAProxy agent-check responder (``--agent-port``): capacity, drain, down.
- :mod:`.upload`: ships each finished session log to S3-compatible storage (``--log-upload``).
- :mod:`.s3`: ``s3://bucket/prefix`` locations and the boto3 client (also for ``duplex-replay``).
- :mod:`.haproxy`: a small client of HAProxy's runtime API (membership without reloads).

See docs/scaling.md and deploy/haproxy/.
"""
