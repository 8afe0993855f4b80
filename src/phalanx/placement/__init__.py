"""phalanx.placement"""
