"""The wire contract shared by the SDK, the coordinator and the agent.

Only pydantic models and enums live here, so that every side parses the same
shapes and importing the protocol costs no server or runtime dependency.
"""
