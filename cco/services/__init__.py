"""Thin asyncio services: each runs one sans-I/O role machine over the QUIC transport."""
