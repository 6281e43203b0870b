// The NetworkDirect helper library: process-wide start-up and address-based adapter lookup, with
// C linkage and the names of Microsoft's ndsupport.h (a program may find them with dlsym).
// NdStartup must precede every other call (they return ND_DEVICE_NOT_READY otherwise); each
// successful NdStartup is balanced by one NdCleanup.
#pragma once

#include "ndwv/ndspi.h"

NDWV_EXTERN_C_BEGIN

// Windows' helpers are __stdcall; x86-64 Linux has one calling convention, so the macro is empty.
#define ND_HELPER_API

HRESULT ND_HELPER_API NdStartup(void);
HRESULT ND_HELPER_API NdCleanup(void);
void ND_HELPER_API NdFlushProviders(void);

// flags: ND_QUERY_EXCLUDE_* (ndwv's provider serves versions 1 and 2 on the same addresses, which
// are left out only when both versions are). Too small a buffer (or NULL) gives
// ND_BUFFER_OVERFLOW and the size needed in *pcbAddressList; no address at all gives ND_SUCCESS
// with *pcbAddressList = 0.
HRESULT ND_HELPER_API NdQueryAddressList(DWORD flags, SOCKET_ADDRESS_LIST* pAddressList,
                                         SIZE_T* pcbAddressList);

// The local address the host would use to reach pRemoteAddress, if an ND adapter serves it.
HRESULT ND_HELPER_API NdResolveAddress(const struct sockaddr* pRemoteAddress,
                                       SIZE_T cbRemoteAddress, struct sockaddr* pLocalAddress,
                                       SIZE_T* pcbLocalAddress);

// ND_SUCCESS if an ND adapter serves the address (the port is ignored), else ND_INVALID_ADDRESS.
HRESULT ND_HELPER_API NdCheckAddress(const struct sockaddr* pAddress, SIZE_T cbAddress);

// Opens the adapter that serves pAddress and returns the interface iid asks for: IND2Adapter,
// or INDAdapter (IID_INDAdapter), which is opened the version 1 way (the provider's class
// factory, then INDProvider::OpenAdapter).
HRESULT ND_HELPER_API NdOpenAdapter(REFIID iid, const struct sockaddr* pAddress, SIZE_T cbAddress,
                                    void** ppIAdapter);

// NdOpenAdapter(IID_INDAdapter, ...).
HRESULT ND_HELPER_API NdOpenV1Adapter(const struct sockaddr* pAddress, SIZE_T cbAddress,
                                      INDAdapter** ppIAdapter);

// ---- The provider's own entry points --------------------------------------------------------------
// What a Windows provider DLL exports and the helper library calls; libndwv is that library too.
// Neither needs NdStartup.

// riid IID_IClassFactory or IID_IUnknown: the class object (IClassFactory::CreateInstance makes
// an INDProvider for IID_INDProvider, an IND2Provider for IID_IND2Provider); riid
// IID_IND2Provider: a version 2 provider at once. rclsid is not looked at (there is one provider).
// Anything else: E_NOINTERFACE, *ppv NULL.
HRESULT DllGetClassObject(REFCLSID rclsid, REFIID riid, void** ppv);

// S_OK when no object of the provider (provider, class factory, adapter or anything made from
// one) is alive and no IClassFactory::LockServer(TRUE) is outstanding; S_FALSE otherwise. The
// helper library's own hold on the device (NdStartup) is no such object.
HRESULT DllCanUnloadNow(void);

NDWV_EXTERN_C_END
