"""Non-Python infrastructure shipped as package data: the Maven POM and configs of the local broker."""
