# Source on the GPU machine after the SGLang carry's calls: SGLang 0.5.17 importable (its own site,
# ahead of the image's newer transformers/tokenizers), the repository root for kvaudit.
export PYTHONPATH="/tmp/sgl-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 SGLANG_DISABLE_REQUEST_LOGGING=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
