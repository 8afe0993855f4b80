"""phalanx.devcluster"""
