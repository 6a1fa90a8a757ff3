"""The trainer service: config, DeepSpeed set-up, distributed training, validation, stall reports,
publishing weights; re-training a run from its log.
"""
