"""The Azure twin: a local emulator of the Azure Resource Manager endpoints clusterbake uses (arm.py)."""
