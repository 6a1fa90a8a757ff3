"""Agents as workflows: the ASearcher agent, its prompts and actions, the scripted expert, the
reasoning web agent, the timed stand-in.
"""
