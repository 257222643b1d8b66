"""KVStore: local, device, nccl and the parameter server (KVStore issue)."""
