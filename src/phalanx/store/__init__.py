"""phalanx.store"""
