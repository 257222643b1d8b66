"""The .mxr flatbuffers format (compiler issue)."""
