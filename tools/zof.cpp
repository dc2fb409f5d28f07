// zof command line: placeholder main until the commands land.
#include <cstdio>
int main() { std::puts("zof"); return 0; }
