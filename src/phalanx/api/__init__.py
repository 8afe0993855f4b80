"""phalanx.api"""
