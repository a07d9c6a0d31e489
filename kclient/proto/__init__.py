"""Code generated from protos/ by scripts/gen-protos; do not edit."""
