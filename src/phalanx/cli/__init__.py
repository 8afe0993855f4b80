"""phalanx.cli"""
