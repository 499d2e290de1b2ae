"""The whole pipeline on one machine (``npu-job demo``); its modules follow in the next commit."""
