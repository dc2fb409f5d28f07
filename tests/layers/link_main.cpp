// The main of the link probes zof_layer_links_<layer> (ctest layers.links_follow_arrows): each
// links the whole of one layer's library with only the layers it builds on, so that any call
// against the arrows, between siblings too, is an undefined reference.
int main() { return 0; }
