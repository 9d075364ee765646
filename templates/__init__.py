"""The official chat-template files of the supported model families, byte-exact, and their family table.

Data only: the logic that renders them and knows each family's history-rewrite rule is `agentrl.chat.families`.
See README.md here for the provenance of every file.
"""
