"""The DeepSpeed trainer consumer, the RL objective and the versioned weight store."""
