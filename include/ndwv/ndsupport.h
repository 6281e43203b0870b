// The NetworkDirect helper library: process-wide start-up and address-based adapter lookup.
// NdStartup must precede every other call (they return ND_DEVICE_NOT_READY otherwise); each
// successful NdStartup is balanced by one NdCleanup.
#pragma once

#include "ndwv/ndspi.h"

HRESULT NdStartup();
HRESULT NdCleanup();
void NdFlushProviders();

// flags: ND_QUERY_EXCLUDE_*. Too small a buffer (or NULL) gives ND_BUFFER_OVERFLOW and the size
// needed in *pcbAddressList; no address at all gives ND_SUCCESS with *pcbAddressList = 0.
HRESULT NdQueryAddressList(DWORD flags, SOCKET_ADDRESS_LIST* pAddressList,
                           SIZE_T* pcbAddressList);

// The local address the host would use to reach pRemoteAddress, if an ND adapter serves it.
HRESULT NdResolveAddress(const sockaddr* pRemoteAddress, SIZE_T cbRemoteAddress,
                         sockaddr* pLocalAddress, SIZE_T* pcbLocalAddress);

// ND_SUCCESS if an ND adapter serves the address (the port is ignored), else ND_INVALID_ADDRESS.
HRESULT NdCheckAddress(const sockaddr* pAddress, SIZE_T cbAddress);

// Opens the adapter that serves pAddress and returns the interface iid asks for.
HRESULT NdOpenAdapter(REFIID iid, const sockaddr* pAddress, SIZE_T cbAddress,
                      void** ppIAdapter);
