"""The simulated engine's agents' APIs (spec §16): Anthropic Messages and OpenAI Responses,
in the dialects that serve them (protocol §11), with their token counts and LM Studio's
stored responses.  ``serve`` answers the routes; the other modules are pure: ``render``
templates a request into tokens, ``messages`` and ``responses`` write the answers, ``stored``
keeps the responses an engine produced.
"""
