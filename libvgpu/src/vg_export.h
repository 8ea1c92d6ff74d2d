/* vg_export.h - libvgpu builds with -fvisibility=hidden; only hooks carry VG_EXPORT. */
#ifndef VG_EXPORT_H
#define VG_EXPORT_H
#define VG_EXPORT __attribute__((visibility("default")))
#endif
