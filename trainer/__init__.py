"""The trainer, by role: policy (the objective, sequences, batching, the step), sft (behaviour
cloning), runtime (the service, its config, DeepSpeed, weight publishing).
"""
