"""Interfaces for other libraries' ecosystems, each importing its library only when it is imported itself."""
