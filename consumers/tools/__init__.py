"""The agent's tools: backends, the toolbox, the tool worker service, the local knowledge base, the
web, URL safety.
"""
