"""The learning itself: the RL objective, sequences and log-probs, batching of groups, one
optimiser step.
"""
