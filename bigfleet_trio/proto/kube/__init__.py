"""Generated protobuf code for the Kubernetes objects (scripts/gen-proto)."""
