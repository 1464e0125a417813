"""Pydantic models of every bcpbus wire object; ``schemas/json/`` holds their JSON Schemas."""
