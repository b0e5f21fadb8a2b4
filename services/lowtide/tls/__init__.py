"""Transport security: certificates (``certs``), TLS settings that follow rotated files
(``config``) and principals from client certificates (``principal``). docs/design/tls.md."""
